package comm

// Communicator is one rank's handle on a group. All collectives are
// asynchronous and return a Work; see the package documentation for the
// ordering, matching, memory and failure rules. Methods may be called from
// any goroutine, but the order in which a rank issues collectives is the
// order in which its calls return, so a rank that issues from several
// goroutines must order them itself.
//
// Argument errors (wrong sizes, invalid dtype, op, root or peer) are
// reported through the returned Work as ErrInvalid, never by a panic.
type Communicator interface {
	// Rank returns this rank's index, 0 <= Rank < Size.
	Rank() int
	// Size returns the number of ranks in the group.
	Size() int

	// AllReduce reduces send element-wise over all ranks with op and
	// leaves the result in recv on every rank. send and recv have the
	// same count and dtype; recv == send (the same address) is the
	// in-place form, as in NCCL and MPI_IN_PLACE. Other overlaps are
	// invalid.
	AllReduce(send, recv Buffer, op Op) Work
	// Broadcast copies root's buf into buf on every other rank.
	Broadcast(buf Buffer, root int) Work
	// Reduce reduces send over all ranks with op into recv on root. recv
	// is ignored on other ranks; on root it may alias send (in place).
	Reduce(send, recv Buffer, op Op, root int) Work
	// AllGather concatenates every rank's send (Count elements each) into
	// recv (Size*Count elements), rank order. send may alias rank's own
	// slot of recv (in place).
	AllGather(send, recv Buffer) Work
	// ReduceScatter reduces send (Size*Count elements) over all ranks with
	// op and leaves block Rank of the result (Count elements) in recv.
	// recv may alias rank's own block of send (in place).
	ReduceScatter(send, recv Buffer, op Op) Work
	// Send sends buf to rank peer; the peer must post a matching Recv.
	Send(buf Buffer, peer int) Work
	// Recv receives into buf from rank peer.
	Recv(buf Buffer, peer int) Work
	// Barrier completes on every rank once every rank has reached it.
	Barrier() Work

	// Abort fails every pending and future collective of this rank with an
	// error that wraps ErrAborted and err. It is local: every pending Work
	// of this rank completes, with an error, within a bound the backend
	// documents, after which the backend writes none of this rank's
	// buffers again. Reaching the peers is best effort (a backend that
	// shares memory with them fails them too; ncclCommAbort and MPI
	// cannot): a peer learns of it through its own deadline or a
	// collective that fails.
	Abort(err error)
	// Close releases the rank's resources. Pending collectives fail with
	// ErrClosed, as after Abort. Close is idempotent.
	Close() error
}

// InPlace reports whether send and recv describe the same memory, the
// in-place form of AllReduce.
func InPlace(send, recv Buffer) bool {
	return send.Addr == recv.Addr && send.Loc == recv.Loc && send.Device == recv.Device
}

// Overlap reports whether the memory of a and b overlaps without being the
// same buffer start (which no collective accepts), counting bytes.
func Overlap(a, b Buffer) bool {
	if a.Loc != b.Loc || a.Device != b.Device || a.Bytes() == 0 || b.Bytes() == 0 || a.Addr == b.Addr {
		return false
	}
	pa, pb := uintptr(a.Addr), uintptr(b.Addr)
	return pa < pb+uintptr(b.Bytes()) && pb < pa+uintptr(a.Bytes())
}
