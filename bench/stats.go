package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ddpgo/ddpgo/comm"
)

// SampleSize bounds the memory a run keeps for its quantiles, whatever
// its number of steps. A run of at most SampleSize measured steps takes
// its quantiles from every step; a longer one from a uniform random
// sample of SampleSize of them (reservoir sampling, Vitter's algorithm R,
// with a fixed seed), so that a soak run of a billion steps holds the same
// few hundred kilobytes as a run of a few thousand. Means and step counts
// always cover every step. Result.Sampled says which case applied.
const SampleSize = 4096

// The quantities of a step, in the order of a sample row.
const (
	qWall = iota
	qIter
	qCompute
	qComm
	qOverlap
	qBusBW
	qGather
	nQuantities
)

// sampler keeps a uniform sample of at most SampleSize rows out of a
// stream of rows, and the exact sums of every row.
type sampler struct {
	rows [][nQuantities]float64
	seen int64
	sum  [nQuantities]float64
	rng  *rand.Rand
}

// newSampler returns a sampler for a stream expected to hold expected
// rows; its memory is sized now, so that adding allocates nothing.
func newSampler(expected int) *sampler {
	return &sampler{
		rows: make([][nQuantities]float64, 0, min(max(expected, 1), SampleSize)),
		rng:  rand.New(rand.NewPCG(0x5eed, 0xddb0)),
	}
}

func (s *sampler) add(v *[nQuantities]float64) {
	s.seen++
	for i, x := range v {
		s.sum[i] += x
	}
	if len(s.rows) < SampleSize {
		s.rows = append(s.rows, *v)
		return
	}
	// Row seen-1 (0-based) replaces a kept row with probability
	// SampleSize/seen, which keeps every row seen so far equally likely
	// to be in the sample.
	if j := s.rng.Int64N(s.seen); j < SampleSize {
		s.rows[j] = *v
	}
}

// dist returns the quantiles of quantity q over the sample and its mean
// over every row.
func (s *sampler) dist(q int) Dist {
	if s.seen == 0 {
		return Dist{}
	}
	col := make([]float64, len(s.rows))
	for i := range s.rows {
		col[i] = s.rows[i][q]
	}
	d := dist(col)
	d.Mean = s.sum[q] / float64(s.seen)
	return d
}

// dist returns the median, 10th and 90th percentiles (nearest rank) and
// the mean of v.
func dist(v []float64) Dist {
	if len(v) == 0 {
		return Dist{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	var sum float64
	for _, x := range s {
		sum += x
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Dist{Median: med, P10: q(0.10), P90: q(0.90), Mean: sum / float64(len(s))}
}

// stepSummary is what Result needs of one rank's measured step.
type stepSummary struct {
	wall, iter, compute, comm, overlap time.Duration
	bytes, overflows                   int64
	gather                             time.Duration // the all-gathers of a sharded step
}

// aggDepth is how many steps ahead of the slowest rank a rank may report
// before it waits. Collectives keep the ranks within a step of each other,
// so the wait is for backends (or test doubles) that do not.
const aggDepth = 8

// aggregator combines the ranks' summaries of each measured step into one
// row as soon as every rank has reported it, so that memory does not grow
// with the number of steps. Ranks report from their own goroutines; a
// rank that stops early calls stop, which releases any rank waiting for it.
type aggregator struct {
	mu      sync.Mutex
	ahead   sync.Cond // signalled when a step is folded or the run stops
	n       int
	ring    [aggDepth][]stepSummary // ring[step%aggDepth][rank]
	got     [aggDepth]int           // ranks that reported the slot's step
	folded  int                     // measured steps every rank reported, combined
	stopped bool

	s         *sampler
	overflows int64
	lastBytes int64 // rank 0's payload in the last folded step
}

func newAggregator(n, steps int) *aggregator {
	a := &aggregator{n: n, s: newSampler(steps)}
	a.ahead.L = &a.mu
	for i := range a.ring {
		a.ring[i] = make([]stepSummary, n)
	}
	return a
}

// add records rank's summary of measured step (0-based). It reports false
// once the run has stopped: the caller stops too.
func (a *aggregator) add(rank, step int, st stepSummary) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for step >= a.folded+aggDepth && !a.stopped {
		a.ahead.Wait()
	}
	if a.stopped {
		return false
	}
	slot := step % aggDepth
	a.ring[slot][rank] = st
	a.got[slot]++
	for a.got[a.folded%aggDepth] == a.n {
		slot := a.folded % aggDepth
		a.fold(a.ring[slot])
		a.got[slot] = 0
		a.folded++
		a.ahead.Broadcast()
	}
	return true
}

// stop makes every later add report false and wakes the ranks waiting.
func (a *aggregator) stop() {
	a.mu.Lock()
	a.stopped = true
	a.ahead.Broadcast()
	a.mu.Unlock()
}

// summarize fills res's statistics with those of the measured steps every
// rank has completed so far; it may run while ranks still add steps.
func (a *aggregator) summarize(res *Result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	res.Steps = a.folded
	s := a.s
	res.Sampled = len(s.rows)
	res.StepTime, res.IterTime, res.ComputeTime = s.dist(qWall), s.dist(qIter), s.dist(qCompute)
	res.CommTime, res.OverlapRatio, res.BusBW = s.dist(qComm), s.dist(qOverlap), s.dist(qBusBW)
	res.GatherTime = s.dist(qGather)
	res.Overflows, res.WireBytes = a.overflows, a.lastBytes
}

// steps returns the number of measured steps every rank completed.
func (a *aggregator) steps() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.folded
}

// fold combines one step of every rank (see Result for the rules) and
// adds it to the sample.
func (a *aggregator) fold(ranks []stepSummary) {
	var w, it, c, cm, ov, cs, ga time.Duration
	var bws float64
	for _, st := range ranks {
		w, it, c, cm, ga = max(w, st.wall), max(it, st.iter), max(c, st.compute), max(cm, st.comm), max(ga, st.gather)
		ov += st.overlap
		cs += st.comm
		bws += comm.BusBW(comm.KindAllReduce, a.n, st.bytes, st.comm)
		a.overflows += st.overflows
	}
	var row [nQuantities]float64
	row[qWall], row[qIter], row[qCompute], row[qComm] = w.Seconds(), it.Seconds(), c.Seconds(), cm.Seconds()
	row[qGather] = ga.Seconds()
	if cs > 0 {
		row[qOverlap] = float64(ov) / float64(cs)
	}
	row[qBusBW] = bws / float64(a.n)
	a.lastBytes = ranks[0].bytes
	a.s.add(&row)
}
