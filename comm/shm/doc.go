// Package shm is the shared-memory collective engine: the protocol by
// which ranks that share memory, goroutines of one process or processes
// of one host, agree on each collective, exchange its inputs and reduce
// them, with no message passing. It sits below the backends, beside
// comm/backend: a backend adapts it to where its memory comes from and how
// its ranks wait, and owns everything else (issuing, the ring of
// operations, watchdogs, errors). Package inproc runs its collectives on
// it, over a segment on the Go heap.
//
// # The segment
//
// A Segment is memory every rank maps (Over), or, for goroutines, the Go
// heap (NewHeap). Its first page holds the group's gate; then each rank
// has a part of whole pages: two headers of one cache line each, two
// descriptors (Desc) and two staging buffers of Layout.Stage bytes, one of
// each for collectives of even and of odd numbers (parities). Only plain
// and atomic loads and stores touch it, so its memory may be shared
// between processes.
//
// # The protocol
//
// Every rank numbers its collectives 1, 2, 3... (k) and calls them in the
// same order. A rank takes part in collective k in one of three ways,
// which its header's flags say: Staged (its input copied into its header,
// up to InlineBytes, or its staging buffer; every rank computes its own
// output from every rank's staged input), Direct (its buffers described;
// every rank reduces a slice of every rank's buffers in place) or Invalid
// (its call is invalid; the adapter keeps the error). A rank's header word
// holds k<<2 | phase for the last collective of that parity it reached.
// One rank's steps, all of them Endpoint methods that neither wait nor
// read a clock nor make a system call:
//
//	step            | needs                                  | does                                  | word after
//	----------------+----------------------------------------+---------------------------------------+-----------
//	Publish         | this rank completed k-1                | call, flags, staged input or Desc,    | k<<2|Called
//	                |                                        | then the word                         |
//	Lagging(Called) | (a look; the adapter waits between)    | first rank whose word < k<<2|Called   |
//	Judge           | every word >= k<<2|Called              | nil, *InvalidError or comm.ErrMismatch|
//	                |                                        | (calls, or paths Staged/Direct, differ)|
//	FinishStaged    | Judge nil, Staged                      | own output from staged inputs,        | (done: k
//	                |                                        | in rank order; writes only recv       | completes)
//	Cancel          | Direct, this rank's wait failed        | gate: k cancelled unless opened       |
//	Agree           | Direct, Judge nil, a Mapper that can   | whether it mapped every peer's        | k<<2|Agreed
//	                | fail (processes)                       | buffers, then the word                |
//	Agreement       | every word >= k<<2|Agreed              | true if every rank mapped; else none  |
//	                |                                        | shares (another path carries k)       |
//	Open            | Direct, Judge nil (and Agreement)      | gate: k opened unless cancelled       |
//	Share           | Open (or a Cancel that lost) said go   | own slice of every rank's buffers,    | k<<2|Shared
//	                |                                        | then the word                         |
//	Lagging(Shared) | (a look; the wait cannot be abandoned) | first rank whose word < k<<2|Shared   | (done: k
//	                |                                        |                                       | completes)
//
// The group's gate word holds k<<2 | go or cancel for the last direct
// collective decided: the first of Open and Cancel for k decides for
// every rank, so either every rank that published shares, or none writes
// a buffer (a rank whose wait failed has failed its operation, and its
// buffers are its caller's again).
//
// # Why it is safe
//
//   - Parities: a rank publishes k only after completing k-1, which it did
//     only once every rank had published k-1, which each did only after
//     completing k-2 and with it every read of what the others staged for
//     k-2. So when a rank overwrites its header, descriptor or staging
//     buffer of parity k%2, nobody reads them any more: two of each
//     suffice. That holds for collectives completed by the protocol; a
//     rank whose wait failed has completed k without it, so an adapter
//     must then fail the group (no rank publishes on the segment again),
//     as inproc's abort does.
//   - Ordering: the word is stored last and loaded first (release and
//     acquire, as sync/atomic's are), so a rank that sees k<<2|Called reads
//     the whole call and input of k.
//   - One verdict: every rank judges the same published calls and reaches
//     the same verdict; a failed verdict writes no output on any rank.
//   - No write after failure: a staged collective writes only the rank's
//     own output; a direct one writes peers' buffers only past the gate.
//   - Same bits everywhere: every output is reduced from the inputs in
//     rank order with the same kernels (package internal/reduce, and fp16
//     for half precision), whichever rank computes it.
//
// The tests drive every rank of a group from one goroutine through chosen
// and fuzzed interleavings (FuzzInterleaving), with mismatched, invalid
// and abandoned calls, ranks taking different paths, and ranks that
// cannot map their peers' buffers.
//
// # Claims
//
// Within a rank, several goroutines may be able to finish a collective:
// the issuer, a Test or Wait of it, a worker. Claim decides which one
// does (the first to Take it); the others leave it alone.
//
// # What adapters supply
//
// Where the segment's memory comes from (NewHeap, or Over a mapping every
// process shares); how a rank waits between looks (spin, yield, park a
// goroutine); how a peer's Desc becomes addresses (Local for ranks of one
// address space, a Mapper for processes); which collectives are Staged and
// which Direct (a size threshold of the adapter's, at most Layout.Stage
// for Staged); timeouts, stall reports and aborts.
//
// For ranks that are processes of one host (Linux), the package has the
// pieces an adapter needs: a segment in a memfd that one rank creates
// (Create) and the others map through /proc (Open); Futex, a wait that
// polls, yields and then sleeps on the segment's futex word, which
// Notify bumps after a publication while a rank sleeps, and that watches
// the process of the rank it waits for (Ident: a peer that exits ends the
// wait at once, one stopped is named at the deadline); Abort, a cause
// every peer's wait ends with; Slabs, memory the peers can map (an
// allocator.Source whose Describe fills a Desc), and PeerMaps, the Mapper
// that maps the peers' slabs through /proc and keeps them from one
// collective to the next. Their tests run ranks in two processes, staged and direct.
package shm
