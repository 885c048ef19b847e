//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

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
	if err := runProcRank(seg, 1, peers, stop, time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "abort":
		seg.Abort(1, "rank 1 gives up: a test")
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
			start := time.Now()
			lag, err := Futex{Liveness: 5 * time.Millisecond}.Wait(ep, k, Called, time.Now().Add(2*time.Second), peers)
			if err == nil || lag != 1 || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("wait for rank 1: rank %d, %v; want %q", lag, err, tc.want)
			}
			var pe *PeerError
			var ae *AbortError
			switch {
			case errors.As(err, &pe):
				if pe.Proc.Pid != peers[1].Pid || pe.Timeout != (tc.signal == syscall.SIGSTOP) {
					t.Errorf("%+v: want process %d, timeout %v", pe, peers[1].Pid, tc.signal == syscall.SIGSTOP)
				}
			case errors.As(err, &ae):
			default:
				t.Errorf("%T: neither a PeerError nor an AbortError", err)
			}
			if tc.signal != syscall.SIGSTOP && time.Since(start) > time.Second {
				t.Errorf("the wait took %v to see rank 1 %s", time.Since(start), tc.want)
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
