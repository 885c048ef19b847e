package comm

// Caps says what a backend does natively. Every backend accepts every
// collective, dtype and op of the contract; Caps tells callers which of
// them cost no extra pass, so that they can choose (hooks.Avg, for one,
// pre-scales and sums where Avg is not native).
type Caps struct {
	// Backend names the implementation ("inproc", "mpi", "nccl").
	Backend string
	// NativeAvg: Op Avg of floating-point dtypes is done inside the
	// backend's reduction, with no separate pass, and overflows only
	// where the average itself does (ncclAvg pre-multiplies each
	// contribution by 1/N; inproc pre-multiplies for a power-of-two group
	// and otherwise sums first, falling back to the pre-multiplied sum
	// where the sum overflows).
	NativeAvg bool
	// HalfPrecision: Float16 and BFloat16 sums round once from a wider
	// accumulation, in the backend's reduction.
	HalfPrecision bool
	// MismatchDetection: ranks that issue different collectives at the
	// same sequence number get ErrMismatch instead of a hang or garbage.
	MismatchDetection bool
	// DeviceMemory: collectives take Buffers with Loc == Device.
	DeviceMemory bool
	// HostMemory: collectives take Buffers with Loc == Host.
	HostMemory bool
}

// Capable is implemented by a backend that reports its Caps.
type Capable interface {
	Capabilities() Caps
}

// CapsOf returns c's capabilities, or, for a backend that does not report
// them, the conservative answer: host memory, nothing native.
func CapsOf(c Communicator) Caps {
	if cc, ok := c.(Capable); ok {
		return cc.Capabilities()
	}
	return Caps{HostMemory: true}
}

// DeviceOwner is implemented by a backend whose rank works on one device
// (NCCL: one GPU per rank). Device returns its ordinal, which Buffers of
// that rank's device memory carry in Buffer.Device.
type DeviceOwner interface {
	Device() int
}

// DeviceOf returns the device ordinal of c's rank, or 0 for a backend
// that does not say (DeviceOwner).
func DeviceOf(c Communicator) int {
	if d, ok := c.(DeviceOwner); ok {
		return d.Device()
	}
	return 0
}

// Grouper is implemented by a backend that can batch several operations
// into one launch (ncclGroupStart and ncclGroupEnd). Between GroupStart
// and the matching GroupEnd, the rank's collectives are recorded and may
// not start until GroupEnd, which launches them together; their Works
// must not be waited for before GroupEnd returns. Groups nest: only the
// outermost GroupEnd launches. A backend with nothing to batch need not
// implement Grouper; GroupStart and GroupEnd below are then no-ops.
type Grouper interface {
	GroupStart()
	GroupEnd() error
}

// GroupStart starts a group on c if c is a Grouper.
func GroupStart(c Communicator) {
	if g, ok := c.(Grouper); ok {
		g.GroupStart()
	}
}

// GroupEnd ends a group on c if c is a Grouper, and returns its error.
func GroupEnd(c Communicator) error {
	if g, ok := c.(Grouper); ok {
		return g.GroupEnd()
	}
	return nil
}
