//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
)

// The process tests run rank 0 in the test and rank 1 in a child process
// (this test binary again, running TestProcessPeer), over a segment in a
// memfd, with Futex waits: the engine as processes of one host run it.

// procJob is the child's and the parent's job: staged all-reduces, inline
// and in the staging buffer, through both parities many times.
func procJob() []int {
	var counts []int
	for i := range 200 {
		counts = append(counts, []int{1, 6, 40, 64}[i%4])
	}
	return counts
}

// peerEnv is the environment variable that makes TestProcessPeer the
// child: the File, the parent's Ident, and what the child does.
const peerEnv = "DDPGO_SHM_TEST_PEER"

// runProcRank runs rank r's part of the job over seg, checking every
// output; stop, when positive, makes it stop before that collective (for
// the fault tests) and return nil.
func runProcRank(seg *Segment, r int, peers []Ident, stop int, deadline time.Time) error {
	n := seg.Layout().Ranks
	ep := seg.Endpoint(r)
	f := Futex{Spin: 20 * time.Microsecond, Yield: 100 * time.Microsecond, Liveness: 10 * time.Millisecond}
	for i, count := range procJob() {
		k := uint64(i + 1)
		if stop > 0 && int(k) == stop {
			return nil
		}
		send := make([]float32, count)
		for e := range send {
			send[e] = float32((r+1)*(e%5+1)) + float32(k)
		}
		recv := make([]float32, count)
		c := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: count, Seq: k}
		ep.Publish(k, c, Staged, unsafe.Pointer(&send[0]), nil)
		seg.Notify()
		if lag, err := f.Wait(ep, k, Called, deadline, peers); err != nil {
			return fmt.Errorf("collective #%d: waiting for rank %d: %w", k, lag, err)
		}
		if err := ep.Judge(k); err != nil {
			return err
		}
		ep.FinishStaged(k, unsafe.Pointer(&recv[0]))
		for e := range count {
			var want float32
			for j := range n {
				want += float32((j+1)*(e%5+1)) + float32(k)
			}
			if recv[e] != want {
				return fmt.Errorf("rank %d, collective #%d, element %d: %v, want %v", r, k, e, recv[e], want)
			}
		}
	}
	return nil
}

// TestProcessPeer is rank 1, when the parent test starts it.
func TestProcessPeer(t *testing.T) {
	env := os.Getenv(peerEnv)
	if env == "" {
		t.Skip("the child of the process tests")
	}
	v := strings.Split(env, ",")
	num := func(i int) uint64 { x, _ := strconv.ParseUint(v[i], 10, 64); return x }
	f := File{Pid: int32(num(0)), Fd: int32(num(1)), Ino: num(2), Size: num(3), Boot: num(4)}
	parent := Ident{Pid: int32(num(5)), Start: num(6)}
	mode, stop := v[7], int(num(8))
	seg, err := Open(f, procLayout)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	peers := []Ident{parent, Self()}
	if !strings.HasPrefix(mode, "direct") {
		if err := runProcRank(seg, 1, peers, stop, time.Now().Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	switch mode {
	case "direct", "direct-nomap":
		var maps PeerMaps
		maps.fail = mode == "direct-nomap"
		if err := runDirectRank(seg, 1, peers, &maps, time.Now().Add(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	case "abort":
		seg.Abort(1, "rank 1 gives up: a test")
	case "close":
		seg.MarkClosed(1)
		for { // alive: only the mark can tell rank 0
			time.Sleep(time.Hour)
		}
	case "hang":
		for { // until killed; not select{}, which the runtime ends as a deadlock
			time.Sleep(time.Hour)
		}
	}
}

var procLayout = Layout{Ranks: 2, Stage: 256}

// startPeer creates a segment and starts the child as rank 1.
func startPeer(t *testing.T, mode string, stop int) (*Segment, *exec.Cmd, []Ident) {
	seg, f, err := Create(procLayout)
	if err != nil {
		t.Skipf("no memfd segment here: %v", err)
	}
	t.Cleanup(func() { seg.Close() })
	me := Self()
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessPeer$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d,%d,%d,%d,%d,%d,%s,%d", peerEnv, f.Pid, f.Fd, f.Ino, f.Size, f.Boot, me.Pid, me.Start, mode, stop))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("rank 1's output:\n%s", out.String())
		}
	})
	// The child's Ident, for the liveness checks: its start time once it
	// has one.
	child := Ident{Pid: int32(cmd.Process.Pid)}
	_, child.Start = procStat(child.Pid)
	return seg, cmd, []Ident{me, child}
}

// TestProcesses runs the job across two processes.
func TestProcesses(t *testing.T) {
	seg, cmd, peers := startPeer(t, "run", 0)
	if err := runProcRank(seg, 0, peers, 0, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("rank 1's process: %v", err)
	}
	if seg.head().sleepers.Load() != 0 {
		t.Errorf("%d sleepers left counted", seg.head().sleepers.Load())
	}
}

// TestProcessFaults: a peer killed, stopped or aborting ends the wait
// for it: at once (killed, aborted) or at the deadline (stopped), naming
// the rank, its process and its state or cause.
func TestProcessFaults(t *testing.T) {
	for _, tc := range []struct {
		mode, want string
		signal     syscall.Signal
	}{
		{"hang", "has exited", syscall.SIGKILL},
		{"hang", "stopped", syscall.SIGSTOP},
		{"abort", "rank 1 aborted: rank 1 gives up: a test", 0},
		{"close", "has closed its communicator", 0},
	} {
		t.Run(fmt.Sprintf("%s-%v", tc.mode, tc.signal), func(t *testing.T) {
			const stop = 50
			seg, cmd, peers := startPeer(t, tc.mode, stop)
			if err := runProcRank(seg, 0, peers, stop, time.Now().Add(30*time.Second)); err != nil {
				t.Fatal(err)
			}
			if tc.signal != 0 {
				cmd.Process.Signal(tc.signal)
				if tc.signal == syscall.SIGSTOP {
					defer cmd.Process.Signal(syscall.SIGCONT)
				}
			}
			// Rank 0 calls the next collective; rank 1 never will.
			ep := seg.Endpoint(0)
			k := uint64(stop)
			send := []float32{1}
			ep.Publish(k, comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: 1, Seq: k}, Staged, unsafe.Pointer(&send[0]), nil)
			seg.Notify()
			// Killed, aborted or closed, rank 1 ends the wait before the
			// deadline (the error says Timeout only at the deadline).
			lag, err := Futex{Liveness: 5 * time.Millisecond}.Wait(ep, k, Called, time.Now().Add(2*time.Second), peers)
			if err == nil || lag != 1 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("wait for rank 1: rank %d, %v; want %q", lag, err, tc.want)
			}
			var pe *PeerError
			var ae *AbortError
			switch {
			case errors.As(err, &pe):
				if pe.Proc.Pid != peers[1].Pid || pe.Timeout != (tc.signal == syscall.SIGSTOP) || pe.Closed != (tc.mode == "close") {
					t.Errorf("%+v: want process %d, timeout %v", pe, peers[1].Pid, tc.signal == syscall.SIGSTOP)
				}
			case errors.As(err, &ae):
			default:
				t.Errorf("%T: neither a PeerError nor an AbortError", err)
			}
		})
	}
}

// TestProcState reads this process and a gone one.
func TestProcState(t *testing.T) {
	me := Self()
	if me.Start == 0 || me.State() != Running {
		t.Fatalf("this process: %+v %v", me, me.State())
	}
	// Waits look at their peers' processes; a warm collective allocates
	// nothing, however long it waits.
	if a := testing.AllocsPerRun(20, func() { me.State() }); a != 0 {
		t.Errorf("State allocates %v times", a)
	}
	if (Ident{Pid: me.Pid, Start: me.Start + 1}).State() != Gone {
		t.Error("a pid with another start time is not gone")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	if (Ident{Pid: int32(cmd.Process.Pid)}).State() != Gone {
		t.Error("a reaped process is not gone")
	}
	if Stopped.String() != "stopped" || Gone.String() != "exited" || Running.String() != "running" {
		t.Error("ProcState names")
	}
}

// TestFutexWake: a rank asleep in Wait is woken by its peer's Notify, not
// by the end of its liveness slice (an hour here).
func TestFutexWake(t *testing.T) {
	seg, _, err := Create(procLayout)
	if err != nil {
		t.Skip(err)
	}
	defer seg.Close()
	peers := []Ident{Self(), Self()}
	call := comm.Call{Kind: comm.KindBarrier, Seq: 1}
	for round := uint64(1); round <= 20; round++ {
		done := make(chan error, 1)
		e0 := seg.Endpoint(0)
		e0.Publish(round, call, Staged, nil, nil)
		seg.Notify()
		go func() {
			_, err := Futex{Liveness: time.Hour}.Wait(e0, round, Called, time.Time{}, peers)
			done <- err
		}()
		for seg.head().sleepers.Load() == 0 {
			time.Sleep(time.Millisecond) // until rank 0 sleeps: the case under test
		}
		e1 := seg.Endpoint(1)
		e1.Publish(round, call, Staged, nil, nil)
		seg.Notify()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: rank 0 still asleep 10 s after rank 1's Notify", round)
		}
	}
}

// TestFutexBarriers: two ranks that sleep in every wait (no spin, no
// yield, liveness an hour) pass 2,000 barriers: Notify, which bumps and
// wakes only when it sees a sleeper, loses no wake-up to a rank that is
// falling asleep while its peer publishes.
func TestFutexBarriers(t *testing.T) {
	seg, _, err := Create(procLayout)
	if err != nil {
		t.Skip(err)
	}
	defer seg.Close()
	peers := []Ident{Self(), Self()}
	const rounds = 2000
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			ep := seg.Endpoint(r)
			for k := uint64(1); k <= rounds; k++ {
				ep.Publish(k, comm.Call{Kind: comm.KindBarrier, Seq: k}, Staged, nil, nil)
				seg.Notify()
				if _, err := (Futex{Liveness: time.Hour}).Wait(ep, k, Called, time.Time{}, peers); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	timeout := time.After(time.Minute)
	for range 2 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatalf("a rank still asleep after a minute: published %d and %d of %d", seg.Published(0), seg.Published(1), rounds)
		}
	}
}

// directCounts are the element counts of the direct all-reduces: slices
// of every size against the 64-byte split, in both parities.
var directCounts = []int{1000, 17, 4096, 1 << 16, 33, 5000}

// runDirectRank runs rank r's direct all-reduces over seg with buffers in
// slabs of this process, mapped by the peer; a rank whose maps fail (or
// whose peer's do) must find every rank agreeing not to share, with no
// buffer written.
func runDirectRank(seg *Segment, r int, peers []Ident, maps *PeerMaps, deadline time.Time) error {
	n := seg.Layout().Ranks
	ep := seg.Endpoint(r)
	var slabs Slabs
	reg, err := slabs.Alloc(8 << 20)
	if err != nil {
		return err
	}
	defer slabs.Free(reg)
	defer maps.Close()
	f := Futex{Spin: 20 * time.Microsecond, Liveness: 10 * time.Millisecond}
	wait := func(k uint64, ph Phase) error {
		seg.Notify()
		if lag, err := f.Wait(ep, k, ph, deadline, peers); err != nil {
			return fmt.Errorf("collective #%d, phase %d: waiting for rank %d: %w", k, ph, lag, err)
		}
		return nil
	}
	all := unsafe.Slice((*float32)(reg.Addr), reg.Size/4)
	for i, count := range directCounts {
		k := uint64(i + 1)
		send, recv := all[:count], all[1<<20:1<<20+count] // 64-byte aligned, as pool blocks are
		for e := range send {
			send[e] = float32((r+1)*(e%9+1)) + float32(k)
		}
		clear(recv)
		d, ok := slabs.Describe(unsafe.Pointer(&send[0]), count*4, unsafe.Pointer(&recv[0]), count*4)
		if !ok {
			return fmt.Errorf("collective #%d: buffers not in the slab", k)
		}
		c := comm.Call{Kind: comm.KindAllReduce, Op: comm.Sum, DType: comm.Float32, Count: count, Seq: k}
		ep.Publish(k, c, Direct, nil, &d)
		if err := wait(k, Called); err != nil {
			return err
		}
		if err := ep.Judge(k); err != nil {
			return err
		}
		maps.Begin(n, r)
		mapped := true
		for j := range n {
			if j != r && maps.Attach(j, seg.Desc(j, k), count*4, count*4) != nil {
				mapped = false
			}
		}
		ep.Agree(k, mapped)
		if err := wait(k, Agreed); err != nil {
			return err
		}
		if !ep.Agreement(k) {
			if slices.ContainsFunc(recv, func(v float32) bool { return v != 0 }) {
				return fmt.Errorf("collective #%d: not agreed, yet recv was written", k)
			}
			continue
		}
		if maps.fail {
			return fmt.Errorf("collective #%d: agreed although this rank could not map", k)
		}
		if open, _ := ep.Open(k); !open {
			return fmt.Errorf("collective #%d: cancelled", k)
		}
		ep.Share(k, maps)
		if err := wait(k, Shared); err != nil {
			return err
		}
		for e := range count {
			var want float32
			for j := range n {
				want += float32((j+1)*(e%9+1)) + float32(k)
			}
			if recv[e] != want {
				return fmt.Errorf("rank %d, collective #%d, element %d: %v, want %v", r, k, e, recv[e], want)
			}
		}
	}
	return nil
}

// TestProcessesDirect runs direct all-reduces across two processes, each
// reading and writing the other's slabs in place; then again with rank
// 1 unable to map rank 0's memory, where nobody may share.
func TestProcessesDirect(t *testing.T) {
	for _, mode := range []string{"direct", "direct-nomap"} {
		t.Run(mode, func(t *testing.T) {
			seg, cmd, peers := startPeer(t, mode, 0)
			var maps PeerMaps
			if err := runDirectRank(seg, 0, peers, &maps, time.Now().Add(30*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("rank 1's process: %v", err)
			}
		})
	}
}

// TestPeerMaps maps this process's own slabs through /proc, as a peer
// would: mappings are kept from one collective to the next, dropped once
// the owner has freed slabs, evicted least recently used past MaxMaps,
// and refused for a descriptor that does not match the file.
func TestPeerMaps(t *testing.T) {
	var slabs Slabs
	maps := PeerMaps{MaxMaps: 2}
	defer maps.Close()
	alloc := func() unsafe.Pointer {
		r, err := slabs.Alloc(1 << 16)
		if err != nil {
			t.Skip(err)
		}
		return r.Addr
	}
	attach := func(p unsafe.Pointer) error {
		d, ok := slabs.Describe(p, 4096, p, 4096)
		if !ok {
			t.Fatal("a slab's memory not described")
		}
		maps.Begin(2, 0)
		return maps.Attach(1, &d, 4096, 4096)
	}
	a, b, c := alloc(), alloc(), alloc()
	for _, p := range []unsafe.Pointer{a, a, b} {
		if err := attach(p); err != nil {
			t.Fatal(err)
		}
	}
	if maps.Mapped() != 2 {
		t.Fatalf("%d mappings after slabs a, a, b; want 2", maps.Mapped())
	}
	if err := attach(c); err != nil || maps.Mapped() != 2 {
		t.Fatalf("slab c past MaxMaps 2: %v, %d mappings", err, maps.Mapped())
	}
	if err := slabs.Free(allocator.Region{Addr: b, Size: 1 << 16}); err != nil {
		t.Fatal(err)
	}
	// The next call sees the frees move: every mapping of this "peer" but
	// the call's own is dropped.
	if err := attach(c); err != nil || maps.Mapped() != 1 {
		t.Fatalf("after a free: %v, %d mappings, want 1", err, maps.Mapped())
	}
	e := alloc() // not mapped yet: Attach opens its file
	d, _ := slabs.Describe(e, 4096, e, 4096)
	d.proc().SendSlab.Ino++
	maps.Begin(2, 0)
	if err := maps.Attach(1, &d, 4096, 4096); !errors.Is(err, syscall.ESTALE) {
		t.Errorf("a descriptor of another file: %v, want ESTALE", err)
	}
	d, _ = slabs.Describe(c, 4096, c, 4096)
	if err := maps.Attach(1, &d, 4096, 1<<17); err == nil {
		t.Error("a buffer past its slab's end was mapped")
	}
	if _, ok := slabs.Describe(unsafe.Pointer(&make([]byte, 64)[0]), 64, c, 64); ok {
		t.Error("Go heap memory described as a slab")
	}
	if _, ok := slabs.Describe(c, 4096, nil, 0); !ok {
		t.Error("a send with no recv (a Reduce off its root) not described")
	}
	var one Slabs // one slab alone: nothing of its own begins where it ends
	if r, err := one.Alloc(1 << 16); err == nil {
		if _, ok := one.Describe(unsafe.Add(r.Addr, 1<<16), 0, nil, 0); ok {
			t.Error("the first byte past a slab described as in it")
		}
		one.Free(r)
	}
	if err := slabs.Free(allocator.Region{Addr: c, Size: 4096}); err == nil {
		t.Error("a slab freed with the wrong size")
	}
}

// TestSlabsFreeNeighbours frees slabs that the kernel placed end to end,
// in the order they were made: each is found by its own base, not taken
// for the neighbour that ends where it begins.
func TestSlabsFreeNeighbours(t *testing.T) {
	var slabs Slabs
	var rs []allocator.Region
	for range 8 {
		r, err := slabs.Alloc(1 << 16)
		if err != nil {
			t.Skip(err)
		}
		rs = append(rs, r)
	}
	for i, r := range rs {
		if err := slabs.Free(r); err != nil {
			t.Fatalf("slab %d: %v", i, err)
		}
	}
	if len(slabs.slabs) != 0 || slabs.frees != 8 {
		t.Errorf("%d slabs left, %d frees", len(slabs.slabs), slabs.frees)
	}
}

// TestStateUnreadable: a process whose /proc entry cannot be read is not
// taken for gone (a peer out of descriptors must not fail a wait).
func TestStateUnreadable(t *testing.T) {
	me := Self()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	// Fill the descriptor table below a low limit, so that opening
	// /proc/<pid>/stat fails with EMFILE.
	low := lim
	low.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var fds []int
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		fds = append(fds, fd)
	}
	st := me.State()
	for _, fd := range fds {
		syscall.Close(fd)
	}
	if st != Running {
		t.Errorf("this process, its stat unreadable: %v, want running", st)
	}
}

// TestDescribed: a descriptor says whether both buffers lie in slabs, as
// Describe reported, for every rank to read alike.
func TestDescribed(t *testing.T) {
	var slabs Slabs
	r, err := slabs.Alloc(1 << 16)
	if err != nil {
		t.Skip(err)
	}
	defer slabs.Free(r)
	heap := make([]byte, 4096)
	other := unsafe.Pointer(&heap[0])
	for _, tc := range []struct {
		name       string
		send, recv unsafe.Pointer
		want       bool
	}{
		{"both in the slab", r.Addr, unsafe.Add(r.Addr, 8192), true},
		{"in place", r.Addr, r.Addr, true},
		{"no recv", r.Addr, nil, true},
		{"recv elsewhere", r.Addr, other, false},
		{"send elsewhere", other, r.Addr, false},
	} {
		d, ok := slabs.Describe(tc.send, 4096, tc.recv, 4096)
		if ok != tc.want || d.Described() != tc.want {
			t.Errorf("%s: Describe %v, Described %v; want %v", tc.name, ok, d.Described(), tc.want)
		}
	}
	if (&Desc{}).Described() {
		t.Error("the zero descriptor is described")
	}
}

// TestAbortCause: a peer sees an abort only once its cause is written,
// never the abort with an empty or partial cause, and never its own.
func TestAbortCause(t *testing.T) {
	seg, err := NewHeap(Layout{Ranks: 3, Stage: 64})
	if err != nil {
		t.Fatal(err)
	}
	h := seg.head()
	// Rank 2 has claimed the abort word and is writing its cause.
	h.abort.Store(abortWriting | 3)
	if r, cause, ok := seg.Aborted(0); ok {
		t.Fatalf("an abort seen while its cause is written: rank %d, %q", r, cause)
	}
	h.abort.Store(0)
	seg.Abort(2, "rank 2 gives up")
	seg.Abort(1, "a later abort") // the first cause stays
	if r, cause, ok := seg.Aborted(0); !ok || r != 2 || cause != "rank 2 gives up" {
		t.Fatalf("Aborted: rank %d, %q, %v; want rank 2's cause", r, cause, ok)
	}
	if _, _, ok := seg.Aborted(2); ok {
		t.Fatal("the aborting rank sees its own abort as a peer's")
	}
}
