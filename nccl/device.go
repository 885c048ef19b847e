package nccl

import (
	"fmt"
	"sync"
)

// device is one CUDA device as this process uses it: its primary context,
// retained once and kept for the life of the process (NCCL and the CUDA
// runtime inside it use the primary context too), and the kernel module,
// loaded on first use.
type device struct {
	ordinal int
	ctx     uintptr

	modOnce sync.Once
	mod     *module
	modErr  error

	// ncclMu serialises the calls into NCCL of the communicators on this
	// device: NCCL does not allow calls to independent communicators of
	// one device from several threads at once.
	ncclMu sync.Mutex
}

// device returns the device of the given ordinal, retaining its primary
// context on first use.
func (l *Library) device(ordinal int) (*device, error) {
	if err := l.init(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d, ok := l.devs[ordinal]; ok {
		return d, nil
	}
	n, err := l.d.deviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("nccl: device %d does not exist (%d CUDA devices)", ordinal, n)
	}
	ctx, err := l.d.retainPrimary(ordinal)
	if err != nil {
		return nil, fmt.Errorf("nccl: device %d: %w", ordinal, err)
	}
	d := &device{ordinal: ordinal, ctx: ctx}
	l.devs[ordinal] = d
	return d, nil
}
