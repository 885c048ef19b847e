//go:build !cgo

package nccl

func cgoEnabled() bool { return false }

func openDriver(ncclPath, cudaPath string, hide map[string]bool) (driver, []symbol, error) {
	return nil, nil, ErrNoCgo
}

// cop stands for the C operation descriptor, which needs cgo.
type cop struct{}

func newCop(kind, dtype, op, peer int, send, recv uintptr, count int) cop { return cop{} }

const (
	copHtoD = iota + 1
	copAllReduce
	copBroadcast
	copReduce
	copAllGather
	copReduceScatter
	copSend
	copRecv
	copDtoH
	copHostFn
)

func configLayout() (size, blockingOff uintptr) { return 0, 0 }
