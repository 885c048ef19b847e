// Package gonumbench measures the PowerSGD matrix products on ResNet-50's
// gradient matrices with package lowrank's kernels and with gonum's
// pure-Go BLAS (blas/gonum, no cgo), one goroutine each way:
//
//	cd internal/lowrank/gonumbench && go test -bench . -count 5
//
// Each benchmark runs, per iteration, one step's products over every
// matrix that PowerSGD compresses at rank r (min_compression_rate 2):
// P = C·Q, Q = Cᵀ·P and C = P·Qᵀ, and reports ms per step and GFLOP/s,
// and the process's CPU time per step (cpu-ms/step, from getrusage), which
// other processes sharing the cores disturb less than the wall clock.
package gonumbench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/ddpgo/ddpgo/internal/lowrank"
	"github.com/ddpgo/ddpgo/models"
)

type mat struct {
	n, m    int
	c, p, q []float32
}

func matrices(b *testing.B, r int) ([]mat, float64) {
	man, err := models.Builtin("resnet50")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var ms []mat
	flops := 0.0
	for _, p := range man.Params {
		if len(p.Shape) < 2 {
			continue
		}
		n := p.Shape[0]
		m := p.Numel() / n
		rk := min(n, m, r)
		if float64((n+m)*rk)*2 >= float64(n*m) {
			continue
		}
		x := mat{n: n, m: m, c: make([]float32, n*m), p: make([]float32, n*rk), q: make([]float32, m*rk)}
		for i := range x.c {
			x.c[i] = float32(rng.NormFloat64())
		}
		for i := range x.q {
			x.q[i] = float32(rng.NormFloat64())
		}
		ms = append(ms, x)
		flops += 3 * 2 * float64(n*m*rk)
	}
	return ms, flops
}

var impls = []struct {
	name               string
	mulQ, mulTP, recon func(x *mat, r int)
}{
	{"lowrank",
		func(x *mat, r int) { lowrank.MulQ(x.p, x.c, x.q, x.n, x.m, r) },
		func(x *mat, r int) { lowrank.MulTP(x.q, x.c, x.p, x.n, x.m, r) },
		func(x *mat, r int) { lowrank.Reconstruct(x.c, nil, x.p, x.q, x.n, x.m, r) }},
	{"gonum",
		func(x *mat, r int) {
			gonum.Implementation{}.Sgemm(blas.NoTrans, blas.NoTrans, x.n, r, x.m, 1, x.c, x.m, x.q, r, 0, x.p, r)
		},
		func(x *mat, r int) {
			gonum.Implementation{}.Sgemm(blas.Trans, blas.NoTrans, x.m, r, x.n, 1, x.c, x.m, x.p, r, 0, x.q, r)
		},
		func(x *mat, r int) {
			gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, x.n, x.m, r, 1, x.p, r, x.q, r, 0, x.c, x.m)
		}},
}

// BenchmarkResNet50 runs one step's three products over ResNet-50's
// compressed matrices. gonum's Sgemm may use several goroutines; GOMAXPROCS
// is set to 1 so that both sides use one core, as the hook's goroutines
// each do.
func BenchmarkResNet50(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, r := range []int{1, 4} {
		for _, im := range impls {
			for _, op := range []string{"P=CQ", "Q=CtP", "C=PQt", "all"} {
				b.Run(fmt.Sprintf("r=%d/%s/%s", r, im.name, op), func(b *testing.B) {
					ms, flops := matrices(b, r)
					fs := map[string][]func(*mat, int){"P=CQ": {im.mulQ}, "Q=CtP": {im.mulTP}, "C=PQt": {im.recon}, "all": {im.mulQ, im.mulTP, im.recon}}[op]
					if op != "all" {
						flops /= 3
					}
					cpu0 := cpuTime()
					for b.Loop() {
						for i := range ms {
							rk := min(ms[i].n, ms[i].m, r)
							for _, f := range fs {
								f(&ms[i], rk)
							}
						}
					}
					b.ReportMetric((cpuTime()-cpu0)*1e3/float64(b.N), "cpu-ms/step")
					per := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(per*1e3, "ms/step")
					b.ReportMetric(flops/per/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// cpuTime returns the process's user and system CPU time in seconds.
func cpuTime() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
