package shm

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ranks that are processes of one host share a segment in a memfd: one
// rank creates it (Create) and tells the others its File, which they map
// through /proc/<pid>/fd (Open). They wait for each other with Futex:
// polling, then sleeping on the segment's futex word, which every
// publication bumps (Segment.Notify); a sleeping wait looks at the process
// of the first rank it waits for every Futex.Liveness, so a peer that has
// exited ends the wait within a slice and one that is stopped is named at
// the deadline.
// A rank that gives up the group says why in the segment (Abort) and
// every peer's wait ends with the cause.

// File identifies a segment's memfd to the other processes of its host.
type File struct {
	Pid  int32  // the creating process
	Fd   int32  // the memfd, in that process
	Ino  uint64 // its inode, checked by Open
	Size uint64
	Boot uint64 // BootID of the creating host
}

// Create makes a segment of layout l in a new memfd mapped shared, for
// ranks that are processes of this host; f tells them how to map it.
// Close unmaps it; CloseFile closes the memfd once every peer has
// opened it.
func Create(l Layout) (s *Segment, f File, err error) {
	if err := l.validate(); err != nil {
		return nil, File{}, err
	}
	fd, err := unix.MemfdCreate("ddpgo-shm", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, File{}, fmt.Errorf("shm: memfd_create: %w", err)
	}
	var st unix.Stat_t
	if err = unix.Ftruncate(fd, int64(l.Size())); err == nil {
		err = unix.Fstat(fd, &st)
	}
	if err == nil {
		s, err = mapFile(fd, l)
	}
	if err != nil {
		unix.Close(fd)
		return nil, File{}, fmt.Errorf("shm: a segment of %d bytes: %w", l.Size(), err)
	}
	s.fd = fd
	return s, File{Pid: int32(os.Getpid()), Fd: int32(fd), Ino: st.Ino, Size: uint64(l.Size()), Boot: BootID()}, nil
}

// Open maps the segment of layout l that process f.Pid created on this
// host.
func Open(f File, l Layout) (*Segment, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	if f.Boot == 0 || f.Boot != BootID() {
		return nil, fmt.Errorf("shm: the segment of process %d is on another host", f.Pid)
	}
	if f.Size != uint64(l.Size()) {
		return nil, fmt.Errorf("shm: the segment of process %d has %d bytes, the layout %d", f.Pid, f.Size, l.Size())
	}
	path := "/proc/" + strconv.Itoa(int(f.Pid)) + "/fd/" + strconv.Itoa(int(f.Fd))
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: opening %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	if st.Ino != f.Ino || st.Size < int64(f.Size) {
		return nil, fmt.Errorf("shm: %s is not the segment process %d described", path, f.Pid)
	}
	return mapFile(fd, l)
}

func mapFile(fd int, l Layout) (*Segment, error) {
	mem, err := unix.Mmap(fd, 0, l.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	s, err := Over(unsafe.Pointer(&mem[0]), len(mem), l)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	s.mapped = mem
	return s, nil
}

// CloseFile closes the memfd of a segment this process created, once
// every peer has opened it; its mapping stays.
func (s *Segment) CloseFile() error {
	if s.fd < 0 {
		return nil
	}
	fd := s.fd
	s.fd = -1
	return unix.Close(fd)
}

// Close unmaps a segment of Create or Open (and closes its memfd if still
// open). Nothing may use it afterwards.
func (s *Segment) Close() error {
	err := s.CloseFile()
	if s.mapped != nil {
		err = errors.Join(err, unix.Munmap(s.mapped))
		s.mapped, s.base = nil, nil
	}
	return err
}

// BootID identifies this host's current boot (a hash of the kernel's
// boot_id; 0 where it cannot be read), so that processes can tell they
// share a host.
func BootID() uint64 {
	bootOnce.Do(func() {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err == nil && len(b) > 0 {
			h := fnv.New64a()
			h.Write(b)
			bootID = h.Sum64() | 1
		}
	})
	return bootID
}

var (
	bootOnce sync.Once
	bootID   uint64
)

// Ident identifies a process across pid reuse: its pid and start time.
type Ident struct {
	Pid   int32
	Start uint64 // clock ticks after boot, /proc/<pid>/stat field 22
}

// Self is this process's Ident.
func Self() Ident {
	id := Ident{Pid: int32(os.Getpid())}
	_, id.Start = procStat(id.Pid)
	return id
}

// ProcState is what a peer's process is doing.
type ProcState uint8

const (
	Running ProcState = iota
	Stopped           // SIGSTOP, or a debugger
	Gone              // exited, a zombie, or its pid names another process now
)

func (p ProcState) String() string {
	switch p {
	case Stopped:
		return "stopped"
	case Gone:
		return "exited"
	}
	return "running"
}

// State reads the state of process id. A process whose /proc entry
// cannot be read (out of file descriptors, say) is taken as running: only
// its absence, a zombie or another start time says it is gone.
func (id Ident) State() ProcState {
	st, start := procStat(id.Pid)
	if st == Gone || id.Start != 0 && start != 0 && start != id.Start {
		return Gone
	}
	return st
}

// procStat reads pid's state letter and start time from /proc/pid/stat.
// It allocates nothing: waits call it in their liveness checks, and a
// warm collective allocates nothing, however long it waits.
func procStat(pid int32) (ProcState, uint64) {
	var path [32]byte
	p := append(path[:0], "/proc/"...)
	p = strconv.AppendInt(p, int64(pid), 10)
	p = append(p, "/stat\x00"...)
	atCWD := unix.AT_FDCWD // a variable: the negative constant does not convert to uintptr
	fd, _, errno := unix.Syscall6(unix.SYS_OPENAT, uintptr(atCWD), uintptr(unsafe.Pointer(&p[0])), unix.O_RDONLY|unix.O_CLOEXEC, 0, 0, 0)
	if errno != 0 {
		if errno == unix.ENOENT || errno == unix.ESRCH {
			return Gone, 0
		}
		return Running, 0 // unreadable: say nothing worse than running
	}
	var buf [1024]byte
	n, _, errno := unix.Syscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	unix.Syscall(unix.SYS_CLOSE, fd, 0, 0)
	if errno == unix.ESRCH {
		return Gone, 0
	}
	if errno != 0 {
		return Running, 0
	}
	b := buf[:n]
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return Running, 0
	}
	b = b[i+2:] // field 3, the state, and on
	state := b[0]
	// Field 22, the start time: 19 fields past the state.
	var start uint64
	for f := 0; f < 19 && len(b) > 0; f++ {
		j := bytes.IndexByte(b, ' ')
		if j < 0 {
			b = nil
			break
		}
		b = b[j+1:]
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		start = start*10 + uint64(c-'0')
	}
	switch state {
	case 'Z', 'X', 'x':
		return Gone, start
	case 'T', 't':
		return Stopped, start
	}
	return Running, start
}

// Notify tells ranks asleep in Futex.Wait that this rank has published:
// a rank whose peers wait with Futex calls it after each Publish, Agree
// and Share.
//
// With no rank asleep it only loads the sleepers' count, a line every rank
// keeps in its cache while nobody sleeps: bumping arrivals on every
// publication moved that line between the cores twice per collective.
// It is safe to skip: a publisher stores its word and then loads
// sleepers, a sleeper adds itself to sleepers and then loads the words,
// all sequentially consistent, so either the publisher sees the sleeper
// (and bumps and wakes) or the sleeper sees the publication (and does not
// sleep).
func (s *Segment) Notify() {
	h := s.head()
	if h.sleepers.Load() != 0 {
		h.arrivals.Add(1)
		futexWake(&h.arrivals)
	}
}

// abortWriting is set in the abort word while the aborting rank writes
// its cause: peers see the abort only with its cause.
const abortWriting = 1 << 31

// Abort marks the group aborted by rank, with cause, unless a rank has
// already, and wakes every sleeping wait. The peers' waits then end with
// an *AbortError; this rank's own do not.
func (s *Segment) Abort(rank int, cause string) {
	h := s.head()
	me := uint32(rank + 1)
	if h.abort.CompareAndSwap(0, abortWriting|me) {
		n := copy(h.cause[:causeBytes-1], cause)
		h.cause[n] = 0
		h.abort.Store(me)
	}
	h.arrivals.Add(1)
	futexWake(&h.arrivals)
}

// Aborted reports the rank that aborted the group and its cause, if one
// other than rank me has.
func (s *Segment) Aborted(me int) (rank int, cause string, ok bool) {
	h := s.head()
	a := h.abort.Load()
	if a == 0 || a&abortWriting != 0 || int(a)-1 == me {
		return 0, "", false
	}
	c := h.cause[:]
	if i := bytes.IndexByte(c, 0); i >= 0 {
		c = c[:i]
	}
	return int(a) - 1, string(c), true
}

// MarkClosed says that rank has closed its communicator and will join
// no more collectives: the peers' waits for it end at once (a
// *PeerError with Closed), where they would otherwise wait for a process
// that is still running until their deadline.
func (s *Segment) MarkClosed(rank int) {
	s.closedMark(rank).Store(1)
	h := s.head()
	h.arrivals.Add(1)
	futexWake(&h.arrivals)
}

// Closed reports whether rank has closed its communicator.
func (s *Segment) Closed(rank int) bool { return s.closedMark(rank).Load() != 0 }

// AbortError is the end of a wait because a peer aborted the group.
type AbortError struct {
	Rank  int
	Cause string
}

func (e *AbortError) Error() string { return fmt.Sprintf("rank %d aborted: %s", e.Rank, e.Cause) }

// PeerError is the end of a wait for rank Rank, whose process is Proc:
// Gone (the wait ended at once) or, at the deadline, in State.
type PeerError struct {
	Rank    int
	Proc    Ident
	State   ProcState
	Timeout bool // the deadline passed
	Closed  bool // the rank closed its communicator (MarkClosed)
}

func (e *PeerError) Error() string {
	if e.Closed {
		return fmt.Sprintf("rank %d (process %d) has closed its communicator", e.Rank, e.Proc.Pid)
	}
	if e.Timeout {
		return fmt.Sprintf("timed out waiting for rank %d (process %d, %s)", e.Rank, e.Proc.Pid, e.State)
	}
	return fmt.Sprintf("rank %d (process %d) has exited", e.Rank, e.Proc.Pid)
}

// Futex is how a rank that is a process waits for its peers: it polls
// for Spin, then polls yielding the processor (sched_yield, for ranks
// that outnumber the processors) for Yield, then sleeps on the segment's
// futex word in slices of Liveness (default 50 ms), after each of which it
// looks at the process of the rank it waits for.
type Futex struct {
	Spin, Yield, Liveness time.Duration
}

// Wait waits until every rank has reached phase ph of collective k, a
// peer aborts (*AbortError) or has closed (*PeerError with Closed), the
// process of the rank waited for is gone (*PeerError), or the deadline
// passes (*PeerError with Timeout; a zero deadline waits without one).
// peers[r] is rank r's process. It returns the first rank it still waited
// for with the error. A wait for Shared must not be given up at a
// deadline: a stopped peer that resumes would still write this rank's
// buffers; only a peer gone or aborted ends it (zero deadline).
func (f Futex) Wait(e *Endpoint, k uint64, ph Phase, deadline time.Time, peers []Ident) (int, error) {
	from := e.Lagging(k, ph, 0)
	if from == e.n {
		return from, nil
	}
	s := e.s
	abort := func() error {
		if r, cause, ok := s.Aborted(e.rank); ok {
			return &AbortError{Rank: r, Cause: cause}
		}
		if from < e.n && s.Closed(from) {
			return &PeerError{Rank: from, Proc: peers[from], State: peers[from].State(), Closed: true}
		}
		return nil
	}
	start := time.Now()
	if f.Spin > 0 {
		for i := 1; ; i++ {
			if from = e.Lagging(k, ph, from); from == e.n {
				return from, nil
			}
			if i%64 == 0 && time.Since(start) >= f.Spin {
				break
			}
		}
	}
	if f.Yield > 0 {
		for {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			if from = e.Lagging(k, ph, from); from == e.n {
				return from, nil
			}
			if err := abort(); err != nil {
				return from, err
			}
			if time.Since(start) >= f.Yield {
				break
			}
		}
	}
	live := f.Liveness
	if live <= 0 {
		live = 50 * time.Millisecond
	}
	h := s.head()
	checked := start
	for {
		if from = e.Lagging(k, ph, from); from == e.n {
			return from, nil
		}
		if err := abort(); err != nil {
			return from, err
		}
		now := time.Now()
		late := !deadline.IsZero() && !now.Before(deadline)
		if now.Sub(checked) >= live || late {
			checked = now
			if from = e.Lagging(k, ph, from); from == e.n {
				return from, nil
			}
			st := peers[from].State()
			if st == Gone || late {
				return from, &PeerError{Rank: from, Proc: peers[from], State: st, Timeout: late}
			}
		}
		slice := live
		if !deadline.IsZero() {
			slice = min(slice, deadline.Sub(now))
		}
		h.sleepers.Add(1)
		v := h.arrivals.Load()
		if from = e.Lagging(k, ph, from); from == e.n {
			h.sleepers.Add(^uint32(0))
			return from, nil
		}
		if err := abort(); err != nil {
			// An Abort or MarkClosed whose bump v already counts would
			// not wake this sleep.
			h.sleepers.Add(^uint32(0))
			return from, err
		}
		futexWait(&h.arrivals, v, max(slice, time.Microsecond))
		h.sleepers.Add(^uint32(0))
		if from = e.Lagging(k, ph, from); from == e.n {
			return from, nil
		}
	}
}

// The futex(2) operations on a word shared between processes (not
// FUTEX_PRIVATE_FLAG).
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

func futexWait(w *atomic32, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
	runtime.KeepAlive(w)
}

func futexWake(w *atomic32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(1<<31-1), 0, 0, 0)
}
