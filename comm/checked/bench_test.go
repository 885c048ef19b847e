package checked_test

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/checked"
	"github.com/ddpgo/ddpgo/comm/commtest"
	"github.com/ddpgo/ddpgo/inproc"
)

// BenchmarkWrapped measures what the wrapper costs per collective: a
// float32 sum all-reduce on two inproc ranks, plain and checked, in the
// same run (compare the two; the machine's load moves both):
//
//	go test ./comm/checked/ -run XXX -bench Wrapped -count 10
func BenchmarkWrapped(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 20} {
		for _, wrapped := range []bool{false, true} {
			name := "plain"
			if wrapped {
				name = "checked"
			}
			b.Run(fmt.Sprintf("%s/%s", commtest.SizeName(size), name), func(b *testing.B) {
				cs, err := inproc.NewGroup(2)
				if err != nil {
					b.Fatal(err)
				}
				group := []comm.Communicator{cs[0], cs[1]}
				if wrapped {
					group = wrapAll(b, group, checked.Options{})
				} else {
					b.Cleanup(func() {
						for _, c := range cs {
							c.Close()
						}
					})
				}
				commtest.Bench(b, group, comm.KindAllReduce, comm.Float32, size)
			})
		}
	}
}
