package shm

import "sync/atomic"

// Claim decides which of a rank's goroutines finishes a collective it
// joined inline (published from the issuing goroutine, not handed to a
// worker): the issuer when it finds every peer published, a Test or Wait
// of the operation, or the rank's worker once the operation is needed.
// The first to Take it finishes it; the others leave it alone, or wait
// for the operation to complete. The zero value holds nothing.
//
// Its word is the operation's sequence number times 4 plus its state:
//
//	offered (claimOffered): published inline; nobody finishes it yet
//	taken   (claimTaken):   a goroutine finishes it, or waits for its peers
//
// Take moves offered to taken, once; Release moves taken back to offered
// (a Wait whose context ended before the peers came). Offer of a later
// operation replaces whatever the word held: a rank joins one collective
// inline at a time, and only once every earlier operation completed.
type Claim struct{ w atomic.Uint64 }

const (
	claimOffered = 1
	claimTaken   = 2
)

// Offer marks operation seq published inline and unclaimed.
func (c *Claim) Offer(seq uint64) { c.w.Store(seq<<2 | claimOffered) }

// Take claims operation seq, reporting whether this goroutine now holds
// it: false if seq is not the operation offered, or someone took it.
func (c *Claim) Take(seq uint64) bool {
	return c.w.Load() == seq<<2|claimOffered && c.w.CompareAndSwap(seq<<2|claimOffered, seq<<2|claimTaken)
}

// Release lets go of operation seq, which this goroutine took and has
// not finished: another may take it.
func (c *Claim) Release(seq uint64) { c.w.CompareAndSwap(seq<<2|claimTaken, seq<<2|claimOffered) }

// Offered reports whether operation seq is offered and not taken.
func (c *Claim) Offered(seq uint64) bool { return c.w.Load() == seq<<2|claimOffered }

// Taken reports whether some goroutine holds operation seq.
func (c *Claim) Taken(seq uint64) bool { return c.w.Load() == seq<<2|claimTaken }
