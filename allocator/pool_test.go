package allocator

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

func TestGetAlignmentAndSize(t *testing.T) {
	p, _ := newPool(t, Options{})
	if !p.Host() {
		t.Error("the default pool says Host() = false")
	}
	sizes := []struct {
		n, want int
	}{
		{0, 0},
		{1, 512},
		{511, 512},
		{512, 512},
		{513, 1024},
		{4 * kib, 4 * kib},
		{4*kib + 1, 4*kib + 512},
		{25*mib + 1, 25*mib + 512},
		{DefaultSlabSize, DefaultSlabSize},
		{DefaultSlabSize + 1, DefaultSlabSize + 512},
		{100*mib + 3, 100*mib + 512},
	}
	var live []Block
	for _, tc := range sizes {
		b := mustGet(t, p, tc.n)
		if b.Size() != tc.want {
			t.Errorf("Get(%d).Size() = %d, want %d", tc.n, b.Size(), tc.want)
		}
		if uintptr(b.Addr())%Alignment != 0 {
			t.Errorf("Get(%d).Addr() = %p, not a multiple of %d", tc.n, b.Addr(), Alignment)
		}
		if tc.n > 0 {
			buf := b.Bytes()
			if len(buf) != tc.want {
				t.Errorf("Get(%d): len(Bytes()) = %d, want %d", tc.n, len(buf), tc.want)
			}
			buf[0], buf[len(buf)-1] = 1, 2
			if got := len(b.Float32s()); got != tc.want/4 {
				t.Errorf("Get(%d): len(Float32s()) = %d", tc.n, got)
			}
			if got := len(b.Uint16s()); got != tc.want/2 {
				t.Errorf("Get(%d): len(Uint16s()) = %d", tc.n, got)
			}
		}
		for _, o := range live {
			if overlaps(b, o) {
				t.Errorf("Get(%d) at %p+%d overlaps live block %p+%d", tc.n, b.Addr(), b.Size(), o.Addr(), o.Size())
			}
		}
		live = append(live, b)
	}
	for _, b := range live {
		mustPut(t, p, b)
	}
	if st := p.Stats(); st.InUse != 0 || st.Blocks != 0 {
		t.Errorf("after putting all: InUse %d, Blocks %d", st.InUse, st.Blocks)
	}
}

func TestGetZero(t *testing.T) {
	p, src := newPool(t, Options{})
	b := mustGet(t, p, 0)
	if b.Size() != 0 || b.Addr() != nil || b.Bytes() != nil || b.Float32s() != nil || b.Uint16s() != nil {
		t.Errorf("Get(0) = size %d addr %p, want an empty block", b.Size(), b.Addr())
	}
	mustPut(t, p, b)
	st := p.Stats()
	if st.Gets != 1 || st.Puts != 1 || st.Hits != 1 || st.Mapped != 0 || src.allocs != 0 {
		t.Errorf("after Get(0)/Put: %+v, %d source allocs", st, src.allocs)
	}
}

// TestCoalescing pins down the reuse and fragmentation behaviour described
// in the package documentation, on 64 KiB slabs cut into 16 KiB blocks.
func TestCoalescing(t *testing.T) {
	const q = 16 * kib
	p, src := newPool(t, Options{SlabSize: 4 * q})
	var b [4]Block
	for i := range b {
		b[i] = mustGet(t, p, q)
		if i > 0 && uintptr(b[i].Addr()) != uintptr(b[i-1].Addr())+q {
			t.Fatalf("block %d at %p, want right after block %d at %p", i, b[i].Addr(), i-1, b[i-1].Addr())
		}
	}
	if st := p.Stats(); st.Slabs != 1 || st.Misses != 1 || st.Hits != 3 {
		t.Fatalf("four quarters: %+v, want one slab, 1 miss, 3 hits", st)
	}

	// Two free quarters that are not neighbours cannot serve a half:
	// external fragmentation, so a new slab is mapped.
	mustPut(t, p, b[0])
	mustPut(t, p, b[2])
	half := mustGet(t, p, 2*q)
	if st := p.Stats(); st.Slabs != 2 || st.Misses != 2 {
		t.Fatalf("half with two separate free quarters: %+v, want a second slab", st)
	}
	mustPut(t, p, half)

	// Best fit: a quarter comes from a free quarter of the first slab, not
	// from the wholly free second slab.
	q0 := mustGet(t, p, q)
	if q0.Addr() != b[0].Addr() {
		t.Errorf("quarter at %p, want the lowest free quarter %p", q0.Addr(), b[0].Addr())
	}
	mustPut(t, p, q0)

	// Putting b[1] merges quarters 0, 1 and 2 into one range.
	mustPut(t, p, b[1])
	three := mustGet(t, p, 3*q)
	if three.Addr() != b[0].Addr() {
		t.Errorf("three quarters at %p, want the coalesced range at %p", three.Addr(), b[0].Addr())
	}
	if st := p.Stats(); st.Slabs != 2 || st.Misses != 2 {
		t.Errorf("three quarters: %+v, want a hit in the first slab", st)
	}
	mustPut(t, p, three)
	mustPut(t, p, b[3])

	// Both slabs are whole again: a full-slab request is a hit, and Trim
	// returns both.
	whole := mustGet(t, p, 4*q)
	if whole.Addr() != b[0].Addr() {
		t.Errorf("whole slab at %p, want %p", whole.Addr(), b[0].Addr())
	}
	mustPut(t, p, whole)
	if got := p.Trim(); got != 8*q {
		t.Errorf("Trim() = %d, want %d", got, 8*q)
	}
	if st := p.Stats(); st.Slabs != 0 || st.Mapped != 0 || st.Trimmed != 8*q || src.live != 0 {
		t.Errorf("after Trim: %+v, %d regions live", st, src.live)
	}
}

func TestDedicatedSlabs(t *testing.T) {
	const slab = 64 * kib
	p, _ := newPool(t, Options{SlabSize: slab})
	big := mustGet(t, p, 100*kib+1)
	need := int64(roundUp(100*kib+1, p.page))
	if st := p.Stats(); st.Mapped != need || st.Slabs != 1 {
		t.Fatalf("large Get: %+v, want one slab of %d bytes", st, need)
	}
	mustPut(t, p, big)

	// A small request never splits the dedicated slab.
	small := mustGet(t, p, 1)
	if st := p.Stats(); st.Slabs != 2 {
		t.Errorf("small Get after a free dedicated slab: %+v, want a regular slab", st)
	}
	mustPut(t, p, small)

	// A smaller large request that it fits reuses it whole.
	again := mustGet(t, p, 90*kib)
	if again.Addr() != big.Addr() || again.Size() != 90*kib {
		t.Errorf("reuse: %p+%d, want %p+%d", again.Addr(), again.Size(), big.Addr(), 90*kib)
	}
	if st := p.Stats(); st.Hits != 1 || st.Misses != 2 || st.InUse != 90*kib {
		t.Errorf("reuse: %+v", st)
	}
	mustPut(t, p, again)

	// One that it would fit with more than a slab to spare does not.
	big2 := mustGet(t, p, 400*kib)
	mustPut(t, p, big2)
	mid := mustGet(t, p, 200*kib)
	if mid.Addr() == big2.Addr() {
		t.Errorf("200 KiB reused a 400 KiB slab: more than a slab wasted")
	}
	mustPut(t, p, mid)
}

func TestLimit(t *testing.T) {
	const slab = 64 * kib
	const limit = 4 * slab
	p, _ := newPool(t, Options{SlabSize: slab, Limit: limit})
	var held []Block
	for range 3 {
		held = append(held, mustGet(t, p, slab))
	}
	held = append(held, mustGet(t, p, 60*kib))
	_, err := p.Get(8 * kib)
	var ex *ExhaustedError
	if !errors.Is(err, ErrExhausted) || !errors.As(err, &ex) {
		t.Fatalf("Get past the limit: %v, want an *ExhaustedError", err)
	}
	inUse := int64(3*slab + 60*kib)
	if ex.Request != 8*kib || ex.Limit != limit || ex.InUse != inUse || ex.Mapped != limit {
		t.Errorf("ExhaustedError %+v", *ex)
	}
	for _, want := range []string{"Get(8192)", "limit 262144 bytes", "258048 bytes in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if _, err := p.Get(limit + 1); !errors.Is(err, ErrExhausted) {
		t.Errorf("Get(limit+1): %v", err)
	}
	if st := p.Stats(); st.Exhausted != 2 {
		t.Errorf("Exhausted = %d, want 2", st.Exhausted)
	}

	// Two wholly free slabs are cached; a dedicated slab of two slabs'
	// size fits only once they are trimmed, which Get does by itself.
	mustPut(t, p, held[0])
	mustPut(t, p, held[1])
	two := mustGet(t, p, 2*slab)
	st := p.Stats()
	if st.Trimmed != 2*slab || st.Slabs != 3 || st.Mapped > limit {
		t.Errorf("Get that needed a trim: %+v", st)
	}
	mustPut(t, p, two)
	mustPut(t, p, held[2])
	mustPut(t, p, held[3])
}

func TestStats(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib, Limit: 1 * mib})
	a := mustGet(t, p, 1000)
	b := mustGet(t, p, 5000)
	mustPut(t, p, a)
	c := mustGet(t, p, 100)
	want := Stats{
		InUse: 5120 + 512, Peak: 1024 + 5120, Mapped: 64 * kib, Limit: 1 * mib, Slabs: 1,
		Hits: 2, Misses: 1, Gets: 3, Puts: 1, Blocks: 2, SlabSize: 64 * kib,
	}
	if got := p.Stats(); got != want {
		t.Errorf("Stats() = %+v\nwant       %+v", got, want)
	}
	mustPut(t, p, b)
	mustPut(t, p, c)
}

func TestSteadyStateAllocations(t *testing.T) {
	p, src := newPool(t, Options{SlabSize: 64 * mib})
	runs := 100
	if invariants.Enabled {
		runs = 5 // every Get and Put checks or fills the whole block
	}
	for _, n := range []int{0, 1, 4 * kib, 25 * mib, 100 * mib} {
		b := mustGet(t, p, n) // warm: maps the slab, grows the metadata
		mustPut(t, p, b)
		allocs := src.allocs
		var err error
		got := testing.AllocsPerRun(runs, func() {
			b, err = p.Get(n)
			if err == nil {
				err = p.Put(b)
			}
		})
		if err != nil {
			t.Fatalf("Get/Put(%d): %v", n, err)
		}
		if got != 0 {
			t.Errorf("Get/Put(%d): %v heap allocations per pair, want 0", n, got)
		}
		if src.allocs != allocs {
			t.Errorf("Get/Put(%d): %d source allocations in steady state, want 0", n, src.allocs-allocs)
		}
	}
	// A mix that splits and coalesces allocates nothing once the node
	// table has grown.
	mix := func() {
		x, _ := p.Get(3 * kib)
		y, _ := p.Get(70 * kib)
		z, _ := p.Get(512)
		p.Put(y)
		p.Put(x)
		p.Put(z)
	}
	mix()
	if got := testing.AllocsPerRun(runs, mix); got != 0 {
		t.Errorf("mixed Get/Put: %v heap allocations, want 0", got)
	}
}

func TestDeviceSource(t *testing.T) {
	src := &countingSource{device: true}
	p, _ := newPool(t, Options{Source: src, SlabSize: 64 * kib})
	if p.Host() {
		t.Error("a pool over a device source says Host() = true")
	}
	b := mustGet(t, p, 1000)
	if b.Addr() == nil || uintptr(b.Addr())%Alignment != 0 || b.Size() != 1024 {
		t.Errorf("device block %p+%d", b.Addr(), b.Size())
	}
	for name, view := range map[string]func(){
		"Bytes":    func() { b.Bytes() },
		"Float32s": func() { b.Float32s() },
		"Uint16s":  func() { b.Uint16s() },
	} {
		func() {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.Contains(msg, name) || !strings.Contains(msg, "fake-device") || !strings.Contains(msg, "cannot address") {
					t.Errorf("%s of a device block: panic %v", name, r)
				}
			}()
			view()
		}()
	}
	mustPut(t, p, b)
}

func TestZeroBlockViewsPanic(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "zero Block") {
			t.Errorf("Bytes of a zero Block: panic %v", r)
		}
	}()
	Block{}.Bytes()
}

func TestOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want error
	}{
		{"negative limit", Options{Limit: -1}, ErrInvalid},
		{"negative slab", Options{SlabSize: -1}, ErrInvalid},
		{"slab over limit", Options{Limit: 1 * mib, SlabSize: 2 * mib}, ErrInvalid},
		{"limit under a page", Options{Limit: 100}, ErrInvalid},
	} {
		if _, err := New(tc.o); !errors.Is(err, tc.want) {
			t.Errorf("%s: New(%+v) = %v, want %v", tc.name, tc.o, err, tc.want)
		}
	}
	p, err := New(Options{Limit: 16 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.SlabSize != 16*mib || st.Limit != 16*mib {
		t.Errorf("slab size under a small limit: %+v", st)
	}
	p.Close()
}

func TestSourceErrors(t *testing.T) {
	boom := errors.New("boom")
	p, _ := newPool(t, Options{Source: &countingSource{fail: boom}, SlabSize: 64 * kib})
	if _, err := p.Get(1); !errors.Is(err, boom) || !strings.Contains(err.Error(), "counting-host") {
		t.Errorf("Get with a failing source: %v", err)
	}
	bad := &countingSource{misalign: true}
	q, _ := newPool(t, Options{Source: bad, SlabSize: 64 * kib})
	if _, err := q.Get(1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get with a misaligned source: %v", err)
	}
	if bad.live != 0 {
		t.Errorf("misaligned region not given back: %d live", bad.live)
	}
}

func TestClose(t *testing.T) {
	p, src := newPool(t, Options{SlabSize: 64 * kib})
	a := mustGet(t, p, 1000)
	b := mustGet(t, p, 200*kib)
	c := mustGet(t, p, 10)
	mustPut(t, p, c)
	free := mustGet(t, p, 100*kib) // a dedicated slab left wholly free
	mustPut(t, p, free)

	err := p.Close()
	if !errors.Is(err, ErrMisuse) || !strings.Contains(err.Error(), "2 blocks") || !strings.Contains(err.Error(), "205824 bytes") {
		t.Fatalf("Close with two blocks out: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := p.Get(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v", err)
	}
	if st := p.Stats(); st.Slabs != 2 || src.live != 2 {
		t.Errorf("after Close: %+v, %d regions live; want the two slabs with blocks", st, src.live)
	}
	// Outstanding blocks stay usable until they are Put.
	a.Bytes()[0] = 1
	b.Bytes()[b.Size()-1] = 1
	mustPut(t, p, a)
	mustPut(t, p, b)
	if st := p.Stats(); st.Slabs != 0 || st.Mapped != 0 || src.live != 0 {
		t.Errorf("after the last Put: %+v, %d regions live", st, src.live)
	}
	if got := p.Trim(); got != 0 {
		t.Errorf("Trim after Close = %d", got)
	}

	q, qsrc := newPool(t, Options{SlabSize: 64 * kib})
	mustPut(t, q, mustGet(t, q, 1))
	if err := q.Close(); err != nil || qsrc.live != 0 {
		t.Errorf("Close with nothing out: %v, %d regions live", err, qsrc.live)
	}
}

func TestMisuse(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib})
	other, _ := newPool(t, Options{SlabSize: 64 * kib})

	b := mustGet(t, p, 1000)
	mustPut(t, p, b)
	wantMisuse(t, "double Put", func() error { return p.Put(b) }, "already Put", ErrMisuse)

	// After its slot is handed out again, the stale copy is still refused
	// and the new owner's block is untouched.
	c := mustGet(t, p, 1000)
	wantMisuse(t, "Put of a stale block", func() error { return p.Put(b) }, "already Put", ErrMisuse)

	o := mustGet(t, other, 1000)
	wantMisuse(t, "foreign block", func() error { return p.Put(o) }, "another pool", ErrMisuse)
	mustPut(t, other, o)

	wantMisuse(t, "zero Block", func() error { return p.Put(Block{}) }, "zero Block", ErrMisuse)
	forged := c
	forged.addr = unsafe.Add(forged.addr, Alignment)
	wantMisuse(t, "forged address", func() error { return p.Put(forged) }, "forged", ErrMisuse)
	forged = c
	forged.size += Alignment
	wantMisuse(t, "forged size", func() error { return p.Put(forged) }, "forged", ErrMisuse)
	forged = c
	forged.node = 1 << 30
	wantMisuse(t, "forged slot", func() error { return p.Put(forged) }, "forged", ErrMisuse)
	forged = Block{p: p, node: none, size: 512}
	wantMisuse(t, "forged empty", func() error { return p.Put(forged) }, "forged", ErrMisuse)
	wantMisuse(t, "negative size", func() error { _, err := p.Get(-1); return err }, "Get(-1)", ErrMisuse)

	if st := p.Stats(); st.Blocks != 1 || st.InUse != 1024 || st.Puts != 1 {
		t.Errorf("misuse changed the pool: %+v", st)
	}
	mustPut(t, p, c)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wantMisuse(t, "Put after Close", func() error { return p.Put(c) }, "after Close", ErrMisuse, ErrClosed)
}

// TestCheckDetectsUncoalesced makes sure the invariants check is not
// vacuous: a Put that skipped coalescing is caught.
func TestCheckDetectsUncoalesced(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib})
	a := mustGet(t, p, 1*kib)
	b := mustGet(t, p, 1*kib)
	mustPut(t, p, b) // b merges with the free rest of the slab

	p.mu.Lock()
	nd := &p.nodes[a.node]
	nd.state = stateFree
	p.slabs[nd.slab].used--
	p.st.Blocks--
	p.st.InUse -= int64(nd.req)
	p.linkFree(a.node) // free, but not merged with its free neighbour
	func() {
		defer func() {
			if msg, _ := recover().(string); !strings.Contains(msg, "not coalesced") {
				t.Errorf("check of uncoalesced neighbours: panic %q", msg)
			}
		}()
		p.checkLocked()
	}()
	// Repair: merge as Put would have.
	p.unlinkFree(a.node)
	p.linkFree(p.coalesce(a.node))
	p.checkLocked()
	p.mu.Unlock()
}

// TestRetire: with Options.Retire, a view of a block kept past Put and
// Close reads zeros and takes writes instead of faulting; the pool still
// gives the slab back (Stats.Trimmed).
func TestRetire(t *testing.T) {
	p, err := New(Options{Retire: true, SlabSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Get(8192)
	if err != nil {
		t.Fatal(err)
	}
	v := b.Bytes()
	for i := range v {
		v[i] = 7
	}
	if err := p.Put(b); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Mapped != 0 || st.Trimmed != 1<<20 {
		t.Fatalf("after Close: %d bytes mapped, %d trimmed; want 0 and the slab", st.Mapped, st.Trimmed)
	}
	for i, x := range v {
		if x != 0 {
			t.Fatalf("byte %d of a retired block reads %d, want 0", i, x)
		}
	}
	v[0] = 1
	if v[0] != 1 {
		t.Fatalf("a write into a retired block reads back %d", v[0])
	}
}
