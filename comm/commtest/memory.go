package commtest

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/allocator"
)

// slot names one of a rank's buffers.
type slot int

const (
	slotSend slot = iota
	slotRecv
	slotOut
	slotSmall
	slotControl
	slotGroup // slotGroup+g: group g of the concurrency check
)

type memKey struct {
	rank int
	slot slot
}

// memory hands out every buffer the suite gives a collective: blocks of an
// allocator.Pool, off the Go heap, so that a cgo backend may hold them past
// the call, as the contract allows. A rank's buffer in a slot is kept from
// check to check and replaced by a larger block when it is outgrown; the
// outgrown block goes back to the pool when the check ends, and not at
// all if an operation of the check did not complete, since the backend may
// still write it.
type memory struct {
	pool      *allocator.Pool
	blocks    map[memKey]allocator.Block
	retired   []allocator.Block
	abandoned int
}

// newMemory returns a memory for ranks ranks' buffers, closed when t ends.
func newMemory(t *testing.T, cfg *config, ranks int) *memory {
	o := allocator.Options{}
	// A rank's largest buffers: three of the large size (send, receive,
	// spare), the gathered blocks and the small checks' buffers.
	if need := int64(ranks) * (4*int64(cfg.largeBytes) + 16<<20); need > allocator.DefaultLimit {
		o.Limit = need
	}
	pool, err := allocator.New(o)
	if err != nil {
		t.Fatalf("commtest: a pool for the suite's buffers: %v", err)
	}
	m := &memory{pool: pool, blocks: make(map[memKey]allocator.Block)}
	t.Cleanup(func() {
		err := m.close()
		switch {
		case err != nil && m.abandoned > 0:
			t.Logf("commtest: closing the buffer pool with %d buffers abandoned: %v", m.abandoned, err)
		case err != nil:
			t.Errorf("commtest: closing the buffer pool: %v", err)
		}
	})
	return m
}

// get returns rank r's buffer in slot s, bytes long, 512-byte aligned and
// never nil (even for 0 bytes). Its contents are what the last user left.
func (m *memory) get(r int, s slot, bytes int) []byte {
	k := memKey{r, s}
	b, ok := m.blocks[k]
	if !ok || b.Size() < bytes {
		nb, err := m.pool.Get(max(bytes, 1))
		if err != nil {
			panic(fmt.Sprintf("commtest: no memory for rank %d's %d-byte buffer: %v", r, bytes, err))
		}
		if ok {
			m.retired = append(m.retired, b)
		}
		m.blocks[k] = nb
		b = nb
	}
	return b.Bytes()[:bytes]
}

// release returns the blocks outgrown during a check to the pool.
func (m *memory) release() {
	for _, b := range m.retired {
		if err := m.pool.Put(b); err != nil {
			panic(fmt.Sprintf("commtest: returning a buffer: %v", err))
		}
	}
	m.retired = m.retired[:0]
}

// abandon forgets every block without returning it, for after an operation
// that did not complete, and returns how many it forgot.
func (m *memory) abandon() int {
	n := len(m.blocks) + len(m.retired)
	clear(m.blocks)
	m.retired = m.retired[:0]
	m.abandoned += n
	return n
}

func (m *memory) close() error {
	m.release()
	for k, b := range m.blocks {
		if err := m.pool.Put(b); err != nil {
			return err
		}
		delete(m.blocks, k)
	}
	return m.pool.Close()
}
