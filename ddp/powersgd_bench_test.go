package ddp

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/hooks"
)

// BenchmarkPowerSGDResNet50 measures what PowerSGD adds to a step on
// ResNet-50's 161 parameter shapes, in 25 MiB buckets: one rank, so the
// collectives cost next to nothing and the step is the hook's compute
// (and avg's step is the Reducer alone). It reports the median step and,
// summed over the buckets of the last step, the time in Launch (error
// feedback and P = M·Q), from Launch to the Qs' completion (the Ps'
// all-reduce, their orthogonalization, Q = Mᵀ·P and the Qs' all-reduce)
// and in Finish (M = P·Qᵀ and the new error), and the process's CPU time
// per step (cpu-ms/step, from getrusage: every goroutine of the rank, which
// other processes on the cores disturb less than the wall clock):
//
//	go test -run - -bench PowerSGDResNet50 -benchtime 20x ./ddp/
func BenchmarkPowerSGDResNet50(b *testing.B) {
	params := loadManifest(b, "resnet50")
	type variant struct {
		name string
		hook func() hooks.Hook
	}
	vs := []variant{{"avg", hooks.Avg}}
	for _, r := range []int{1, 4} {
		for _, ef := range []bool{true, false} {
			o := hooks.DefaultPowerSGDOptions()
			o.Rank, o.StartIter, o.ErrorFeedback = r, 0, ef
			name := fmt.Sprintf("powersgd-r%d", r)
			if !ef {
				name += "-noef"
			}
			vs = append(vs, variant{name, func() hooks.Hook { return hooks.PowerSGD(o) }})
		}
	}
	for _, v := range vs {
		b.Run(v.name, func(b *testing.B) {
			p := newPair(b, newTestGroup(b, 1), params, func() Options { return Options{Hook: v.hook(), NoZeroGrad: true} })
			for range 3 {
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
			}
			var times []time.Duration
			cpu0 := cpuTime()
			for b.Loop() {
				t0 := time.Now()
				if err := p.step(); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(t0))
			}
			b.ReportMetric((cpuTime()-cpu0)*1e3/float64(len(times)), "cpu-ms/step")
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "ms/step-median")
			var launch, wire, finish time.Duration
			for _, s := range p.rs[0].Stats().Buckets {
				launch += s.CompressEnd - s.CompressStart
				wire += s.CollectiveEnd - s.CollectiveStart
				finish += s.DecompressEnd - s.CollectiveEnd
			}
			b.ReportMetric(float64(launch.Microseconds())/1000, "ms/launch")
			b.ReportMetric(float64(wire.Microseconds())/1000, "ms/collectives")
			b.ReportMetric(float64(finish.Microseconds())/1000, "ms/finish")
			b.ReportMetric(float64(p.rs[0].Stats().Bytes), "wire-B/step")
		})
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
