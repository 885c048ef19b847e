package shm

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ddpgo/ddpgo/allocator"
)

// Direct collectives between processes: every rank reads and writes its
// peers' buffers in place, so the buffers must be memory the peers can
// map. Slabs is such memory (an allocator.Source: each slab a memfd
// mapped shared), Describe says where a rank's buffers lie in it, and
// PeerMaps maps the peers' slabs through /proc/<pid>/fd, keeping the
// mappings from one collective to the next.

// Slabs is this process's memory that the other processes of its host
// can map. It implements allocator.Source; its methods may be called
// from any goroutine.
type Slabs struct {
	mu    sync.Mutex
	slabs []slab
	next  uint64 // ids, never reused in this process
	frees uint64 // slabs freed so far: peers drop their stale mappings when it moves
}

type slab struct {
	mem     []byte
	fd      int
	id, ino uint64
	base    uintptr
}

// Alloc maps a new slab of size bytes.
func (s *Slabs) Alloc(size int) (allocator.Region, error) {
	if size <= 0 {
		return allocator.Region{}, fmt.Errorf("%w: shared memory of %d bytes", allocator.ErrInvalid, size)
	}
	fd, err := unix.MemfdCreate("ddpgo-commpool", unix.MFD_CLOEXEC)
	if err != nil {
		return allocator.Region{}, fmt.Errorf("shm: shared memory (memfd) of %d bytes: %w", size, err)
	}
	var st unix.Stat_t
	var mem []byte
	if err = unix.Ftruncate(fd, int64(size)); err == nil {
		if err = unix.Fstat(fd, &st); err == nil {
			mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		}
	}
	if err != nil {
		unix.Close(fd)
		return allocator.Region{}, fmt.Errorf("shm: shared memory (memfd) of %d bytes: %w", size, err)
	}
	s.mu.Lock()
	s.next++
	s.slabs = append(s.slabs, slab{mem: mem, fd: fd, id: s.next, ino: st.Ino, base: uintptr(unsafe.Pointer(&mem[0]))})
	s.mu.Unlock()
	return allocator.Region{Addr: unsafe.Pointer(&mem[0]), Size: size}, nil
}

// Free unmaps a slab of Alloc. A peer's mapping of it keeps its pages
// until the peer drops it, at its next direct collective with this
// process, whose descriptor carries the new count of frees.
func (s *Slabs) Free(r allocator.Region) error {
	s.mu.Lock()
	i := slices.IndexFunc(s.slabs, func(sl slab) bool { return sl.base == uintptr(r.Addr) })
	if i < 0 || len(s.slabs[i].mem) != r.Size {
		s.mu.Unlock()
		return fmt.Errorf("%w: shm: freeing %d bytes at %p, not a slab", allocator.ErrInvalid, r.Size, r.Addr)
	}
	sl := s.slabs[i]
	s.slabs[i] = s.slabs[len(s.slabs)-1]
	s.slabs = s.slabs[:len(s.slabs)-1]
	s.frees++
	s.mu.Unlock()
	return errors.Join(unix.Munmap(sl.mem), unix.Close(sl.fd))
}

// Name names the source in the pool's errors and metrics.
func (s *Slabs) Name() string { return "shared memory" }

// Host reports that Go code may read and write the memory.
func (s *Slabs) Host() bool { return true }

// find returns the index of the slab holding [p, p+n), or -1: p itself
// inside the slab, even for n == 0, so that a slab ending where the next
// begins is not taken for it. s.mu is held.
func (s *Slabs) find(p uintptr, n int) int {
	for i := range s.slabs {
		sl := &s.slabs[i]
		if p >= sl.base && p-sl.base < uintptr(len(sl.mem)) && uintptr(n) <= uintptr(len(sl.mem))-(p-sl.base) {
			return i
		}
	}
	return -1
}

// procDesc is Desc as Slabs writes it: where a rank's two buffers lie in
// its process's slabs.
type procDesc struct {
	Send, Recv     uintptr // in the owner's address space
	Pid            int32
	SendFd, RecvFd int32
	_              int32
	Boot, Frees    uint64
	SendSlab       slabRef
	RecvSlab       slabRef
}

type slabRef struct{ ID, Ino, Base, Size uint64 }

var _ [DescBytes - unsafe.Sizeof(procDesc{})]byte // fits a Desc

func (d *Desc) proc() *procDesc { return (*procDesc)(unsafe.Pointer(d)) }

// Describe returns the descriptor of a rank's buffers of a direct
// collective, send of sendBytes and recv of recvBytes (a nil recv, as a
// Reduce off its root has, is described as none), and whether they lie
// in this process's slabs. Where they do not, the collective cannot be
// direct: the adapter says so in its Agree, and every rank leaves it to
// another path.
func (s *Slabs) Describe(send unsafe.Pointer, sendBytes int, recv unsafe.Pointer, recvBytes int) (Desc, bool) {
	var d Desc
	p := d.proc()
	p.Send, p.Recv = uintptr(send), uintptr(recv)
	p.Pid, p.Boot = int32(os.Getpid()), BootID()
	s.mu.Lock()
	defer s.mu.Unlock()
	p.Frees = s.frees
	ref := func(sl *slab) slabRef {
		return slabRef{ID: sl.id, Ino: sl.ino, Base: uint64(sl.base), Size: uint64(len(sl.mem))}
	}
	i := s.find(p.Send, sendBytes)
	if i < 0 || p.Boot == 0 {
		return d, false
	}
	p.SendFd, p.SendSlab = int32(s.slabs[i].fd), ref(&s.slabs[i])
	if recv == nil {
		return d, true
	}
	j := s.find(p.Recv, recvBytes)
	if j < 0 {
		return d, false
	}
	p.RecvFd, p.RecvSlab = int32(s.slabs[j].fd), ref(&s.slabs[j])
	return d, true
}

// Described reports whether d describes buffers that lie in their
// process's slabs, as Describe reported: every rank reads every peer's
// descriptor, so every rank can tell alike whether a collective can be
// direct at all, before any tries to map.
func (d *Desc) Described() bool {
	p := d.proc()
	return p.Boot != 0 && p.SendSlab.Size != 0 && (p.Recv == 0 || p.RecvSlab.Size != 0)
}

// PeerMaps maps the peers' slabs into this process, for Share (it is a
// Mapper), keeping each mapping until the peer frees slabs or more than
// MaxMaps are kept (the least recently used goes). One goroutine at a
// time uses it: the one running the rank's direct collectives.
type PeerMaps struct {
	// MaxMaps bounds the mappings kept; 0 means 256.
	MaxMaps int

	maps     []peerMap
	me       int      // this process's rank in the collective begun
	calls    uint64   // Begin's count, to tell the mappings of this call
	seen     []uint64 // each rank's count of frees at its last call
	resolved []bufs   // by rank, for this call
	fail     bool     // tests: every mapping fails
}

type peerMap struct {
	pid      int32
	id, base uint64
	mem      []byte
	used     uint64
}

type bufs struct{ send, recv unsafe.Pointer }

// Begin starts a direct collective of n ranks, this process being rank
// me: Attach each peer's descriptor, then Share.
func (m *PeerMaps) Begin(n, me int) {
	m.calls++
	m.me = me
	if len(m.resolved) < n {
		m.resolved = make([]bufs, n)
		seen := make([]uint64, n)
		for i := range seen {
			seen[i] = ^uint64(0)
		}
		copy(seen, m.seen)
		m.seen = seen
	}
	clear(m.resolved)
}

// Attach maps rank's buffers of the collective begun, from its
// descriptor d: send of sendBytes, recv of recvBytes (none where d
// describes none), or says why it cannot.
func (m *PeerMaps) Attach(rank int, d *Desc, sendBytes, recvBytes int) error {
	p := d.proc()
	if p.Boot == 0 || p.Boot != BootID() {
		return fmt.Errorf("rank %d (process %d) is on another host", rank, p.Pid)
	}
	send, err := m.attach(p.Pid, p.SendFd, p.SendSlab, p.Send, sendBytes)
	if err != nil {
		return fmt.Errorf("rank %d's send buffer (/proc/%d/fd/%d): %w", rank, p.Pid, p.SendFd, err)
	}
	var recv unsafe.Pointer
	if p.Recv != 0 {
		if recv, err = m.attach(p.Pid, p.RecvFd, p.RecvSlab, p.Recv, recvBytes); err != nil {
			return fmt.Errorf("rank %d's recv buffer (/proc/%d/fd/%d): %w", rank, p.Pid, p.RecvFd, err)
		}
	}
	m.resolved[rank] = bufs{send, recv}
	if p.Frees != m.seen[rank] {
		// The peer has freed slabs since its last call: drop its mappings
		// this call does not use, which may be of freed slabs.
		m.drop(func(pm *peerMap) bool { return pm.pid == p.Pid && pm.used != m.calls })
		m.seen[rank] = p.Frees
	}
	return nil
}

// Map returns the addresses Attach mapped for rank, and this process's
// own for rank me.
func (m *PeerMaps) Map(rank int, d *Desc) (send, recv unsafe.Pointer) {
	if rank == m.me {
		return Local.Map(rank, d)
	}
	b := m.resolved[rank]
	return b.send, b.recv
}

// attach returns the address here of buffer at (in process pid's address
// space) in slab ref, mapping the slab if it is not mapped yet.
func (m *PeerMaps) attach(pid, fd int32, ref slabRef, at uintptr, bytes int) (unsafe.Pointer, error) {
	off := uint64(at) - ref.Base
	if uint64(at) < ref.Base || off >= ref.Size || uint64(bytes) > ref.Size-off {
		return nil, fmt.Errorf("%d bytes at %#x are not in its slab [%#x, +%d)", bytes, at, ref.Base, ref.Size)
	}
	if m.fail {
		return nil, unix.EPERM
	}
	for i := range m.maps {
		if pm := &m.maps[i]; pm.pid == pid && pm.id == ref.ID {
			pm.used = m.calls
			return unsafe.Pointer(&pm.mem[off]), nil
		}
	}
	// A slab of pid that overlaps this one in pid's address space has
	// been freed there.
	m.drop(func(pm *peerMap) bool {
		return pm.pid == pid && pm.base < ref.Base+ref.Size && ref.Base < pm.base+uint64(len(pm.mem))
	})
	max := m.MaxMaps
	if max <= 0 {
		max = 256
	}
	if len(m.maps) >= max {
		lru := -1
		for i := range m.maps {
			if m.maps[i].used != m.calls && (lru < 0 || m.maps[i].used < m.maps[lru].used) {
				lru = i
			}
		}
		if lru < 0 {
			return nil, fmt.Errorf("this collective alone needs more than %d mappings", max)
		}
		m.unmap(lru)
	}
	path := "/proc/" + strconv.Itoa(int(pid)) + "/fd/" + strconv.Itoa(int(fd))
	f, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(f)
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return nil, err
	}
	if st.Ino != ref.Ino || uint64(st.Size) < ref.Size {
		return nil, unix.ESTALE // not the file the peer described
	}
	// Not MAP_POPULATE: the pages this process touches fault in once.
	mem, err := unix.Mmap(f, 0, int(ref.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	m.maps = append(m.maps, peerMap{pid: pid, id: ref.ID, base: ref.Base, mem: mem, used: m.calls})
	return unsafe.Pointer(&mem[off]), nil
}

func (m *PeerMaps) drop(stale func(*peerMap) bool) {
	for i := 0; i < len(m.maps); {
		if stale(&m.maps[i]) {
			m.unmap(i)
		} else {
			i++
		}
	}
}

func (m *PeerMaps) unmap(i int) {
	unix.Munmap(m.maps[i].mem)
	m.maps[i] = m.maps[len(m.maps)-1]
	m.maps = m.maps[:len(m.maps)-1]
}

// Mapped is the number of peers' slabs mapped here.
func (m *PeerMaps) Mapped() int { return len(m.maps) }

// Close unmaps every peer's slab.
func (m *PeerMaps) Close() {
	for len(m.maps) > 0 {
		m.unmap(len(m.maps) - 1)
	}
}
