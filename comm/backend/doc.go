// Package backend is the kit every ddpgo backend is built from: what a
// backend needs beyond its transport, written once. It sits beside comm
// as database/sql/driver sits beside database/sql: backends (inproc, mpi,
// nccl) and wrappers (comm/checked) import it; programs use comm.
//
// # The ring
//
// Ring[D] is one rank's ordered ring of RingSize operations. Each
// operation has a sequence number, 1, 2, 3..., in the order the rank
// issued it, and lives in slot seq%RingSize: a descriptor of the
// backend's type D (what the transport needs: kind, buffers, root) and a
// result slot. A comm.Work is the pair (backend, seq), so issuing and
// waiting allocate nothing: the backend's TestOp and WaitOp, which make
// it a comm.Waiter, are Ring.Test and Ring.Wait.
//
// Issuing, under the backend's own lock that orders its issues:
//
//	seq := r.Reserve(backend) // waits until operation seq-RingSize has completed
//	*r.Op(seq) = desc          // the descriptor, with seq in it if the transport wants it
//	r.Publish(seq)             // Issued() == seq: Test and Wait accept it
//	// hand seq to the transport (a queue, a worker's wake-up), return comm.NewWork(backend, seq)
//
// An operation the issuer ran whole before publishing it (mpi's staged
// all-reduce that every peer had posted) is published complete instead:
// r.PublishDone(seq), its number kept, nothing to run or wake.
//
// Whoever runs the operation reads *r.Op(seq) after seeing it published
// and calls r.Complete(seq, err) once, when the operation's buffers are
// no longer touched. The descriptor stays valid until then: the slot is
// not reused before the operation completes, because Reserve of the
// operation RingSize later waits for it. A rank with RingSize operations
// pending therefore blocks its next issue until the oldest completes, and
// its own watchdog (not the ring) bounds that wait.
//
// Breaking these rules is a backend's mistake, and panics in every build
// (not only under the invariants tag): Publish or PublishDone of any
// number but the one Reserve returned, Complete of an operation not yet
// published or of #0, Complete(seq+RingSize) while seq is pending, and a
// second Waiters.Drop of a channel. The checks compare words that the
// call loads anyway, or that its caller has just loaded (Publish), and
// Complete loads Issued once more.
//
// # Results
//
// Complete writes the result under a writing bit: the slot's done word
// holds seq|writing while the error is replaced, then seq, so a reader
// that loads done, then the error, then done again never pairs one
// operation's number with another's error. Complete may race with itself:
// the first call for an operation records its result and reports true,
// later ones do nothing, so several goroutines may each try to finish an
// operation (a Wait, a Test and a worker). Operations may complete out of
// order; each slot only ever moves forward.
//
// Test and Wait may be called from any goroutine, any number of times,
// long after the operation completed. A success reads its slot; once the
// slot has been reused, the failure log answers: every failure is logged
// (the last FailLogMax/2 or more of them are kept), so an old failure is
// reported as that failure, an old success as nil, and an operation older
// than the log as comm.ErrInvalid "no longer kept", never as a success. A
// backend whose failures are permanent (Sticky: once its group has failed
// every later operation fails) stops logging at its first failure after
// that and reports every later old operation with its failure.
//
// Wait tests, then (Config.Spin) polls with a Spinner's pacing, then
// registers with the ring's Waiters and sleeps; Complete wakes every
// sleeper, at the cost of one atomic load while nobody sleeps. Ring.Await
// waits the same way for a condition of the backend's (Notify wakes it).
//
// # Hooks
//
// A backend takes part in Test and Wait through the optional interfaces
// of Config.Hooks: Advancer (Test may finish an operation itself: inproc
// finishes a collective joined on the issuing goroutine once every peer
// has arrived; checked records a launched operation whose inner Work has
// completed; a device backend can query its events), Parker (a Wait is
// about to sleep, so something else must now complete the operation),
// WaitErrorer (what a Wait that its context ended says) and Sticky.
//
// # Watching
//
// A backend's watchdog goroutine watches the oldest incomplete operation
// through Oldest: on each tick Oldest.Check walks past what has completed
// (never more than a ring: Reserve bounds how far behind the oldest
// pending operation can be), reads when the oldest was issued, and says
// whether a stall report or the timeout is due on the comm.Watchdog's
// schedule. What the backend then does (report, abort its communicator,
// end the job) is its own.
//
// # Arguments
//
// Rules.Check is the rulebook of the comm contract, the one every backend and
// comm/checked enforce: valid dtype, counts and addresses, each buffer's
// bytes within an int and ending before the end of memory; a valid op for
// reductions; root and peer in range, and a peer other than the rank;
// AllReduce and Reduce on root with matching send and recv, either the
// same buffer or sharing no byte; AllGather and ReduceScatter with exactly
// Size blocks, sharing no byte or in place as the rank's own block; plus
// what Rules says of the backend's memory (host only, a count limit). No
// size is multiplied where the product could overflow, and host memory is
// one space whatever a host buffer's Device says. It returns an Invalid,
// a reason and two integers, which Text and Err turn into the same words
// on every rank, so a wrapper can send another rank's reason in a few
// bytes. Checking a valid call allocates nothing.
//
// # Adopting the kit
//
// A new backend keeps only its transport: a Ring[desc] in its
// communicator, Init'ed with its name and rank; its collectives build a
// desc, check it, Reserve, Publish and hand the sequence number over;
// its engine calls Complete. An argument error is a completed operation
// like any other (issue it and Complete it with the error, in order), so
// the rank's sequence numbers stay those of its calls. A backend whose
// communicator type is exported passes an unexported conversion of its
// pointer as Config.Hooks, so the hooks stay off its API. The package
// Example is such a backend, whole, in a file to start from.
package backend
