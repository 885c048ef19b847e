package hier_test

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
)

// BenchmarkAllReduce measures a float32 sum all-reduce on four ranks as
// one flat inproc group and as the composite over inproc levels (2x2),
// whole and in chunks of 1 MiB, in the same run. In one process both levels are shared memory, so the
// composite only adds its phases here; what it saves, a network carrying
// each host's bytes once, is not in this benchmark:
//
//	go test ./comm/hier/ -run XXX -bench AllReduce -count 5
func BenchmarkAllReduce(b *testing.B) {
	for _, size := range []int{4 << 10, 256 << 10, 8 << 20} {
		for _, shape := range []string{"flat", "2x2", "2x2chunk1MiB"} {
			if shape == "2x2chunk1MiB" && size < 4<<20 {
				continue
			}
			b.Run(fmt.Sprintf("%s/%s", commtest.SizeName(size), shape), func(b *testing.B) {
				var cs []comm.Communicator
				if shape == "flat" {
					g, err := inproc.NewGroup(4)
					if err != nil {
						b.Fatal(err)
					}
					cs = asComms(g)
				} else {
					chunk := 0
					if shape == "2x2chunk1MiB" {
						chunk = 1 << 20
					}
					cs = asComms(newChunkedJob(b, layouts[0].l, inproc.Options{}, chunk))
				}
				b.Cleanup(func() {
					for _, c := range cs {
						c.Close()
					}
				})
				commtest.Bench(b, cs, comm.KindAllReduce, comm.Float32, size)
			})
		}
	}
}
