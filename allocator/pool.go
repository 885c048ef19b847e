package allocator

import (
	"fmt"
	"math"
	"math/bits"
	"os"
	"sync"
	"unsafe"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

// Alignment is the alignment of every block's address and the granularity
// of its size.
const Alignment = 512

// DefaultLimit is the limit on bytes mapped when Options.Limit is 0.
const DefaultLimit int64 = 1 << 30

// DefaultSlabSize is the slab size when Options.SlabSize is 0 (reduced to
// the limit when the limit is smaller).
const DefaultSlabSize = 64 << 20

// Options configures a Pool. The zero value is usable: host memory, a 1 GiB
// limit, 64 MiB slabs.
type Options struct {
	// Source maps the slabs; nil means HostSource().
	Source Source
	// Limit bounds the bytes mapped from the source; 0 means DefaultLimit.
	Limit int64
	// SlabSize is the size of the slabs small requests are carved from,
	// rounded up to the page size; 0 means DefaultSlabSize. Requests larger
	// than SlabSize get a slab of their own.
	SlabSize int
	// Retire makes the slabs the pool gives back once it is closed
	// retired rather than freed, where the Source is a Retirer (see
	// there): for an owner whose Go views of blocks it cannot revoke
	// (ddp's gradient slices), so that a view used after Close reads zeros
	// instead of faulting. Each retired slab keeps its address space for
	// the life of the process, and no memory.
	Retire bool
}

// Stats is a snapshot of a pool's counters, cheap to take and free of
// allocation, meant to be exported as metrics.
type Stats struct {
	InUse  int64 // bytes in outstanding blocks (sum of their Size)
	Peak   int64 // the largest InUse seen
	Mapped int64 // bytes mapped from the source, the quantity Limit bounds
	Limit  int64 // the limit on Mapped
	Slabs  int   // slabs mapped

	Hits   uint64 // Gets served without mapping
	Misses uint64 // Gets that mapped a new slab
	Gets   uint64 // successful Gets (Hits + Misses)
	Puts   uint64 // successful Puts

	Blocks    int    // blocks outstanding
	Exhausted uint64 // Gets that failed with ErrExhausted
	Trimmed   int64  // bytes returned to the source by Trim, by a Get about to fail, or by Close
	SlabSize  int    // the pool's slab size
}

// Pool is a caching allocator of aligned blocks. It is safe for concurrent
// use. See the package documentation for its model.
type Pool struct {
	mu       sync.Mutex
	src      Source
	host     bool
	limit    int64
	slabSize int
	page     int

	nodes     []node
	freeNodes int32 // head of the list of unused nodes (linked by fnext)
	slabs     []slab
	freeSlots []int32 // indices of unused entries of slabs

	bins    [numBins]int32 // heads of the free lists of regular slabs, by size class
	binMask uint64         // bit b set iff bins[b] is not empty
	bigFree int32          // head of the list of free dedicated slabs' nodes

	closed bool
	retire bool // Options.Retire
	st     Stats
}

const (
	none    = -1
	numBins = 64
)

// Node states.
const (
	stateUnused uint8 = iota // on the unused-node list
	stateFree                // a free range, on a free list
	stateUsed                // a block handed out
)

// A node describes one range of one slab: a free range or a block handed
// out. The nodes of a slab form a list in address order (prev, next), which
// is what coalescing walks.
type node struct {
	off   int // byte offset in the slab
	size  int // bytes, a multiple of Alignment
	req   int // Size() of the block while used
	slab  int32
	prev  int32 // address neighbours in the same slab
	next  int32
	fprev int32 // links of the free list the node is on
	fnext int32
	gen   uint32 // incremented each time the node is handed out
	state uint8
	bin   uint8
}

// A slab is one region from the source. A regular slab (SlabSize bytes) is
// split into blocks; a dedicated slab holds one large block and is reused
// whole.
type slab struct {
	region    Region
	first     int32 // the node at offset 0
	used      int   // blocks handed out
	dedicated bool
	live      bool
}

// New returns a pool configured by o.
func New(o Options) (*Pool, error) {
	if o.Limit < 0 {
		return nil, fmt.Errorf("%w: Options.Limit %d is negative", ErrInvalid, o.Limit)
	}
	if o.SlabSize < 0 {
		return nil, fmt.Errorf("%w: Options.SlabSize %d is negative", ErrInvalid, o.SlabSize)
	}
	p := &Pool{src: o.Source, limit: o.Limit, page: os.Getpagesize(), freeNodes: none, bigFree: none, retire: o.Retire}
	if p.src == nil {
		p.src = HostSource()
	}
	p.host = p.src.Host()
	if p.limit == 0 {
		p.limit = DefaultLimit
	}
	if p.page%Alignment != 0 {
		p.page = roundUp(p.page, Alignment)
	}
	if o.SlabSize == 0 {
		p.slabSize = DefaultSlabSize
		if int64(p.slabSize) > p.limit {
			p.slabSize = int(p.limit) / p.page * p.page
		}
		if p.slabSize == 0 {
			return nil, fmt.Errorf("%w: Options.Limit %d is less than a page (%d bytes)", ErrInvalid, p.limit, p.page)
		}
	} else {
		if o.SlabSize > math.MaxInt-p.page {
			return nil, fmt.Errorf("%w: Options.SlabSize %d is too large", ErrInvalid, o.SlabSize)
		}
		p.slabSize = roundUp(o.SlabSize, p.page)
		if int64(p.slabSize) > p.limit {
			return nil, fmt.Errorf("%w: Options.SlabSize %d (rounded to %d) exceeds Options.Limit %d", ErrInvalid, o.SlabSize, p.slabSize, p.limit)
		}
	}
	for i := range p.bins {
		p.bins[i] = none
	}
	p.st.Limit = p.limit
	p.st.SlabSize = p.slabSize
	return p, nil
}

// Get returns a block of Size() == n rounded up to Alignment whose address
// is a multiple of Alignment. The memory is not cleared: it holds what the
// previous user left (zeros in a newly mapped slab).
//
// Get(0) returns an empty block: Size() 0, a nil Addr, no memory. Putting
// it back is allowed and does nothing; a double Put of an empty block is
// not detected, since it holds nothing.
//
// When serving n would take the bytes mapped past the limit, Get first
// returns every wholly free slab to the source (as Trim does) and then, if
// that is not enough, fails with an *ExhaustedError. After Close, Get fails
// with ErrClosed.
func (p *Pool) Get(n int) (Block, error) {
	if n < 0 {
		return Block{}, p.misuse(fmt.Errorf("%w: Get(%d): negative size", ErrMisuse, n))
	}
	p.mu.Lock()
	b, err := p.get(n)
	if invariants.Enabled {
		p.checkLocked()
	}
	p.mu.Unlock()
	if invariants.Enabled && p.host && err == nil && b.size > 0 {
		// Outside the lock; the block goes back before the panic, so the
		// pool stays consistent for whoever recovers.
		if msg := poisoned(b.addr, b.size, "Get", n); msg != "" {
			p.Put(b)
			panic(msg)
		}
	}
	return b, err
}

func (p *Pool) get(n int) (Block, error) {
	if p.closed {
		return Block{}, fmt.Errorf("%w: Get(%d) after Close", ErrClosed, n)
	}
	if n == 0 {
		p.st.Gets++
		p.st.Hits++
		return Block{p: p, node: none}, nil
	}
	if int64(n) > p.limit || n > math.MaxInt-p.page {
		return Block{}, p.exhausted(n, int64(n))
	}
	size := roundUp(n, Alignment)
	var i int32
	hit := true
	if size > p.slabSize {
		need := roundUp(size, p.page)
		if i = p.findDedicated(need); i != none {
			p.unlinkFree(i)
		} else {
			s, err := p.mapSlab(n, need, true)
			if err != nil {
				return Block{}, err
			}
			i, hit = p.slabs[s].first, false
		}
	} else {
		if i = p.findFree(size); i == none {
			s, err := p.mapSlab(n, p.slabSize, false)
			if err != nil {
				return Block{}, err
			}
			i, hit = p.slabs[s].first, false
			p.unlinkFree(i)
		} else {
			p.unlinkFree(i)
		}
		p.split(i, size)
	}
	nd := &p.nodes[i]
	nd.state = stateUsed
	nd.gen++
	nd.req = size
	sl := &p.slabs[nd.slab]
	sl.used++
	if hit {
		p.st.Hits++
	} else {
		p.st.Misses++
	}
	p.st.Gets++
	p.st.Blocks++
	p.st.InUse += int64(size)
	p.st.Peak = max(p.st.Peak, p.st.InUse)
	return Block{p: p, addr: unsafe.Add(sl.region.Addr, nd.off), size: size, node: i, gen: nd.gen}, nil
}

// Put returns b to the pool. A Put of a block that is not live in this pool
// (already Put, from another pool, zero or forged) fails with ErrMisuse and
// changes nothing; under the invariants build tag it panics. After Close,
// Put of a live block is still accepted, and the last Put of a slab's
// blocks unmaps that slab.
func (p *Pool) Put(b Block) error {
	if b.p != p {
		if b.p == nil {
			return p.misuse(fmt.Errorf("%w: Put of a zero Block (size %d, addr %p)", ErrMisuse, b.size, b.addr))
		}
		return p.misuse(fmt.Errorf("%w: Put of a block of another pool (size %d, addr %p)", ErrMisuse, b.size, b.addr))
	}
	p.mu.Lock()
	err := p.put(b)
	if invariants.Enabled {
		p.checkLocked()
	}
	p.mu.Unlock()
	if err != nil {
		return p.misuse(err)
	}
	return nil
}

func (p *Pool) put(b Block) error {
	if err := p.validate(b, "Put"); err != nil {
		if p.closed {
			return fmt.Errorf("%w, after Close: %w", err, ErrClosed)
		}
		return err
	}
	p.st.Puts++
	if b.node == none {
		return nil
	}
	i := b.node
	nd := &p.nodes[i]
	s := nd.slab
	if invariants.Enabled && p.host {
		poison(unsafe.Add(p.slabs[s].region.Addr, nd.off), nd.size)
	}
	nd.state = stateFree
	p.st.Blocks--
	p.st.InUse -= int64(nd.req)
	sl := &p.slabs[s]
	sl.used--
	if !sl.dedicated {
		i = p.coalesce(i)
	}
	p.linkFree(i)
	if p.closed && sl.used == 0 {
		p.unmapSlab(s)
	}
	return nil
}

// validate reports why b is not a live block of p, or nil. The caller holds
// p.mu.
func (p *Pool) validate(b Block, op string) error {
	if b.node == none {
		if b.size == 0 && b.addr == nil && b.gen == 0 {
			return nil
		}
		return fmt.Errorf("%w: %s of a forged Block (size %d, addr %p)", ErrMisuse, op, b.size, b.addr)
	}
	if b.node < 0 || int(b.node) >= len(p.nodes) {
		return fmt.Errorf("%w: %s of a forged Block (size %d, addr %p)", ErrMisuse, op, b.size, b.addr)
	}
	nd := &p.nodes[b.node]
	if nd.gen != b.gen || nd.state != stateUsed {
		if nd.gen == b.gen || nd.gen-b.gen < 1<<31 {
			return fmt.Errorf("%w: %s of a block already Put (double Put or use after Put: size %d, addr %p)", ErrMisuse, op, b.size, b.addr)
		}
		return fmt.Errorf("%w: %s of a forged Block (size %d, addr %p)", ErrMisuse, op, b.size, b.addr)
	}
	if unsafe.Add(p.slabs[nd.slab].region.Addr, nd.off) != b.addr || nd.req != b.size {
		return fmt.Errorf("%w: %s of a forged Block (size %d, addr %p; the pool has size %d at that slot)", ErrMisuse, op, b.size, b.addr, nd.req)
	}
	return nil
}

// Trim returns every wholly free slab to the source and reports the bytes
// released. Blocks outstanding keep their slabs mapped.
func (p *Pool) Trim() int64 {
	p.mu.Lock()
	n := p.trimLocked()
	if invariants.Enabled {
		p.checkLocked()
	}
	p.mu.Unlock()
	return n
}

func (p *Pool) trimLocked() int64 {
	var released int64
	for s := range p.slabs {
		sl := &p.slabs[s]
		if sl.live && sl.used == 0 {
			released += int64(sl.region.Size)
			p.unmapSlab(int32(s))
		}
	}
	return released
}

// Host reports whether the pool's memory is host memory that Go code may
// read and write (Block.Bytes and the other views work), as its Source
// says.
func (p *Pool) Host() bool { return p.src.Host() }

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	return st
}

// Close unmaps every slab that holds no outstanding block, and makes later
// Gets fail with ErrClosed. Memory a block still uses is never unmapped
// under it (C code may hold it): with blocks outstanding, Close returns an
// error wrapping ErrMisuse that names their count and bytes, and each of
// their slabs is unmapped when its last block is Put. Closing again does
// nothing and returns nil.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.trimLocked()
	if invariants.Enabled {
		p.checkLocked()
	}
	if p.st.Blocks > 0 {
		return fmt.Errorf("%w: Close with %d blocks (%d bytes) outstanding; their %d slabs (%d bytes) stay mapped until the blocks are Put",
			ErrMisuse, p.st.Blocks, p.st.InUse, p.st.Slabs, p.st.Mapped)
	}
	return nil
}

// misuse returns err, or panics with it under the invariants build tag.
func (p *Pool) misuse(err error) error {
	if invariants.Enabled {
		panic(err)
	}
	return err
}

func (p *Pool) exhausted(n int, need int64) error {
	p.st.Exhausted++
	return &ExhaustedError{Request: n, Need: need, Limit: p.limit, InUse: p.st.InUse, Mapped: p.st.Mapped}
}

// mapSlab maps a slab of size bytes, trimming first if the limit requires,
// and returns its index. A regular slab's single node is put on its free
// list; a dedicated slab's node is left off every list, ready to hand out.
func (p *Pool) mapSlab(n, size int, dedicated bool) (int32, error) {
	if p.st.Mapped+int64(size) > p.limit {
		p.trimLocked()
		if p.st.Mapped+int64(size) > p.limit {
			return none, p.exhausted(n, int64(size))
		}
	}
	r, err := p.src.Alloc(size)
	if err != nil {
		return none, fmt.Errorf("allocator: Get(%d): %s source: slab of %d bytes: %w", n, p.src.Name(), size, err)
	}
	if r.Size < size || uintptr(r.Addr)%Alignment != 0 || r.Addr == nil {
		ferr := p.src.Free(r)
		return none, fmt.Errorf("%w: %s source returned %d bytes at %p for a slab of %d bytes (alignment %d); free: %v", ErrInvalid, p.src.Name(), r.Size, r.Addr, size, Alignment, ferr)
	}
	if p.st.Mapped+int64(r.Size) > p.limit {
		// The source rounded the slab up past the limit.
		_ = p.src.Free(r)
		return none, p.exhausted(n, int64(r.Size))
	}
	var s int32
	if k := len(p.freeSlots); k > 0 {
		s = p.freeSlots[k-1]
		p.freeSlots = p.freeSlots[:k-1]
	} else {
		p.slabs = append(p.slabs, slab{})
		s = int32(len(p.slabs) - 1)
	}
	i := p.newNode()
	nd := &p.nodes[i]
	nd.off, nd.size, nd.req, nd.slab = 0, r.Size, 0, s
	nd.prev, nd.next = none, none
	nd.state = stateFree
	p.slabs[s] = slab{region: r, first: i, dedicated: dedicated, live: true}
	p.st.Mapped += int64(r.Size)
	p.st.Slabs++
	if invariants.Enabled && p.host {
		poison(r.Addr, r.Size)
	}
	if !dedicated {
		p.linkFree(i)
	}
	return s, nil
}

// unmapSlab returns a wholly free slab to the source.
func (p *Pool) unmapSlab(s int32) {
	sl := &p.slabs[s]
	i := sl.first
	if invariants.Enabled {
		nd := &p.nodes[i]
		if nd.state != stateFree || nd.size != sl.region.Size || nd.next != none {
			panic(fmt.Sprintf("allocator: invariant: unmapping slab %d that is not wholly free", s))
		}
		if p.host {
			if msg := poisoned(sl.region.Addr, sl.region.Size, "unmap", sl.region.Size); msg != "" {
				panic(msg)
			}
		}
	}
	p.unlinkFree(i)
	p.releaseNode(i)
	// A failing munmap leaves the memory mapped but unreachable from the
	// pool; nothing can be done about it here, and the slab is forgotten
	// either way so it is never handed out again.
	if rt, ok := p.src.(Retirer); ok && p.retire && p.closed {
		if rt.Retire(sl.region) != nil {
			_ = p.src.Free(sl.region)
		}
	} else {
		_ = p.src.Free(sl.region)
	}
	p.st.Mapped -= int64(sl.region.Size)
	p.st.Trimmed += int64(sl.region.Size)
	p.st.Slabs--
	*sl = slab{first: none}
	p.freeSlots = append(p.freeSlots, s)
}

// split cuts node i down to size bytes, putting the rest on a free list.
func (p *Pool) split(i int32, size int) {
	if p.nodes[i].size == size {
		return
	}
	j := p.newNode()
	a, b := &p.nodes[i], &p.nodes[j]
	b.off, b.size, b.req, b.slab = a.off+size, a.size-size, 0, a.slab
	b.prev, b.next = i, a.next
	b.state = stateFree
	if a.next != none {
		p.nodes[a.next].prev = j
	}
	a.next = j
	a.size = size
	p.linkFree(j)
}

// coalesce merges free node i with its free address neighbours and returns
// the node that now covers the range. Neighbours are taken off their free
// lists; i is not on any.
func (p *Pool) coalesce(i int32) int32 {
	if prev := p.nodes[i].prev; prev != none && p.nodes[prev].state == stateFree {
		p.unlinkFree(prev)
		p.absorb(prev, i)
		i = prev
	}
	if next := p.nodes[i].next; next != none && p.nodes[next].state == stateFree {
		p.unlinkFree(next)
		p.absorb(i, next)
	}
	return i
}

// absorb appends node j, the address successor of i, to i and releases j.
func (p *Pool) absorb(i, j int32) {
	a, b := &p.nodes[i], &p.nodes[j]
	a.size += b.size
	a.next = b.next
	if b.next != none {
		p.nodes[b.next].prev = i
	}
	p.releaseNode(j)
}

// findFree returns the free node of a regular slab that best fits size
// bytes, or none. Within the request's size class it takes the smallest
// range that fits; otherwise the smallest range of the next non-empty
// class. Ties go to the lowest slab and offset, which packs blocks toward
// the start of the oldest slabs and leaves the others free to Trim.
func (p *Pool) findFree(size int) int32 {
	b := binOf(size)
	if best := p.bestIn(b, size); best != none {
		return best
	}
	m := p.binMask &^ (uint64(2)<<b - 1)
	if m == 0 {
		return none
	}
	return p.bestIn(bits.TrailingZeros64(m), size)
}

func (p *Pool) bestIn(b int, size int) int32 {
	best := int32(none)
	for i := p.bins[b]; i != none; i = p.nodes[i].fnext {
		if p.nodes[i].size >= size && (best == none || p.before(i, best)) {
			best = i
		}
	}
	return best
}

// before orders free ranges by size, then slab, then offset.
func (p *Pool) before(i, j int32) bool {
	a, b := &p.nodes[i], &p.nodes[j]
	if a.size != b.size {
		return a.size < b.size
	}
	if a.slab != b.slab {
		return a.slab < b.slab
	}
	return a.off < b.off
}

// findDedicated returns the smallest free dedicated slab of at least need
// bytes that wastes less than one slab size, or none.
func (p *Pool) findDedicated(need int) int32 {
	best := int32(none)
	for i := p.bigFree; i != none; i = p.nodes[i].fnext {
		sz := p.nodes[i].size
		if sz >= need && sz-need < p.slabSize && (best == none || sz < p.nodes[best].size) {
			best = i
		}
	}
	return best
}

// binOf is the size class of a free range: floor(log2(size / Alignment)).
func binOf(size int) int {
	return bits.Len(uint(size/Alignment)) - 1
}

// linkFree puts free node i at the head of its free list.
func (p *Pool) linkFree(i int32) {
	nd := &p.nodes[i]
	nd.state = stateFree
	head := &p.bigFree
	if !p.slabs[nd.slab].dedicated {
		b := binOf(nd.size)
		nd.bin = uint8(b)
		head = &p.bins[b]
		p.binMask |= 1 << b
	}
	nd.fprev, nd.fnext = none, *head
	if *head != none {
		p.nodes[*head].fprev = i
	}
	*head = i
}

// unlinkFree takes free node i off its free list.
func (p *Pool) unlinkFree(i int32) {
	nd := &p.nodes[i]
	dedicated := p.slabs[nd.slab].dedicated
	if nd.fprev != none {
		p.nodes[nd.fprev].fnext = nd.fnext
	} else if dedicated {
		p.bigFree = nd.fnext
	} else {
		p.bins[nd.bin] = nd.fnext
		if nd.fnext == none {
			p.binMask &^= 1 << nd.bin
		}
	}
	if nd.fnext != none {
		p.nodes[nd.fnext].fprev = nd.fprev
	}
	nd.fprev, nd.fnext = none, none
}

// newNode returns an unused node, reusing one when it can. A reused node
// keeps its generation, so a stale Block naming it never validates.
func (p *Pool) newNode() int32 {
	if i := p.freeNodes; i != none {
		p.freeNodes = p.nodes[i].fnext
		p.nodes[i].fnext = none
		return i
	}
	p.nodes = append(p.nodes, node{prev: none, next: none, fprev: none, fnext: none})
	return int32(len(p.nodes) - 1)
}

func (p *Pool) releaseNode(i int32) {
	nd := &p.nodes[i]
	nd.state = stateUnused
	nd.prev, nd.next, nd.fprev = none, none, none
	nd.fnext = p.freeNodes
	p.freeNodes = i
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }
