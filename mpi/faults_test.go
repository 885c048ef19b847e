//go:build mpi && cgo

package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/shm"
	"github.com/ddpgo/ddpgo/internal/mpitest"
	"github.com/ddpgo/ddpgo/mpi"
)

// faultDeadline bounds each surviving rank's wait in the fault jobs.
const faultDeadline = 3 * time.Second

// TestSharedMemoryFaults: under mpirun with 2, 3 and 4 ranks, the last rank
// fails while the others wait for it in a shared-memory all-reduce, which
// needs no MPI call to wait: every other rank's wait ends within its
// deadline with an error naming the rank, its process and what happened.
//
//   - kill: it is killed (SIGKILL) before it joins a staged all-reduce;
//   - exit: its process exits in the middle of a direct all-reduce, when
//     every rank has mapped the others' buffers;
//   - abort: it aborts the job (Abort) before it joins, slowly (the peers
//     must see the abort only once its cause is written);
//   - stop: it is stopped (SIGSTOP) before it joins: the waits end at
//     their deadline naming it stopped, and once it is continued (by rank
//     0, from the process id the error names) the same all-reduce
//     completes, exact, on every rank;
//   - stuck: it is stopped and nobody continues it, while the others wait
//     without a deadline of their own: the communicator's Timeout ends the
//     job, naming the stopped rank;
//   - close: it closes its communicator before it joins, and lives on
//     until the others have said how their waits ended: each names it as
//     having closed its communicator, not as a rank not yet joined;
//   - pause: it is stopped (for 2.5 s, by rank 0) while it waits itself:
//     its first stall report once continued names rank 0 as not joined
//     and says that it did not run itself, and the all-reduce then
//     completes.
//
// Open MPI's runtime ends the other ranks when one dies or aborts the
// job; they then hold off its SIGTERM, so that they may say what their
// waits saw before its SIGKILL a second later.
func TestSharedMemoryFaults(t *testing.T) {
	mpitest.Mpirun(t)
	for _, f := range []struct {
		name string
		nps  []int
	}{
		{"kill", []int{2, 3, 4}},
		{"exit", []int{2, 3, 4}},
		{"abort", []int{2, 3, 4}},
		{"stop", []int{2, 3, 4}},
		{"stuck", []int{2, 4}},
		{"close", []int{2, 3}},
		{"pause", []int{2}},
	} {
		for _, np := range f.nps {
			t.Run(fmt.Sprintf("%s/np%d", f.name, np), func(t *testing.T) {
				dir := t.TempDir()
				out, took, err := childJob(t, np, "fault:"+f.name+":"+dir)
				s := string(out)
				victim := np - 1
				var ee *exec.ExitError
				switch f.name {
				case "stop", "pause":
					if err != nil {
						t.Fatalf("job: %v\n%s", err, s)
					}
				default:
					if !errors.As(err, &ee) || ee.ExitCode() == 0 {
						t.Fatalf("job: %v; want a non-zero exit\n%s", err, s)
					}
				}
				if f.name == "pause" {
					want := fmt.Sprintf(`CHILD: rank %d stalled: .* for rank\(s\) \[0\]: rank 0 \(process \d+\) has not joined it; this rank did not run for at least \d`, victim)
					if !regexp.MustCompile(want).MatchString(s) || strings.Count(s, "CHILD: completed after the pause") != np {
						t.Fatalf("want rank %d's report to name rank 0 and its own pause, then the all-reduce done:\n%s", victim, s)
					}
					if testing.Verbose() {
						t.Logf("the job ended %v after it started:\n%s", took.Round(time.Millisecond), s)
					}
					return
				}
				if f.name == "stuck" {
					want := fmt.Sprintf(`rank %d \(process \d+, stopped\)`, victim)
					if !regexp.MustCompile(want).MatchString(s) || !strings.Contains(s, "Options.Timeout") {
						t.Fatalf("want the timeout to end the job, naming rank %d stopped:\n%s", victim, s)
					}
					if took > 30*time.Second {
						t.Errorf("the job took %v to end after a 1s timeout", took)
					}
					return
				}
				want := map[string]string{
					"kill":  fmt.Sprintf(`rank %d \(process \d+\) has exited`, victim),
					"exit":  fmt.Sprintf(`rank %d \(process \d+\) has exited`, victim),
					"abort": fmt.Sprintf(`rank %d aborted the job: injected failure`, victim),
					"stop":  fmt.Sprintf(`rank %d \(process \d+, stopped\) has not joined it: context deadline exceeded`, victim),
					"close": fmt.Sprintf(`group aborted: rank %d \(process \d+\) has closed its communicator$`, victim),
				}[f.name]
				re := regexp.MustCompile(`CHILD: rank (\d+): waited ([^ ]+): (.*)`)
				seen := 0
				for _, m := range re.FindAllStringSubmatch(s, -1) {
					r, _ := strconv.Atoi(m[1])
					seen++
					if r == victim {
						t.Errorf("the failed rank went on: %s", m[0])
						continue
					}
					if !regexp.MustCompile(want).MatchString(m[3]) {
						t.Errorf("rank %d's wait ended with %q; want %q", r, m[3], want)
					}
				}
				if seen != np-1 {
					t.Errorf("%d ranks said how their wait ended; want the %d others than rank %d:\n%s", seen, np-1, victim, s)
				}
				if f.name == "stop" && strings.Count(s, "CHILD: completed after the stop") != np {
					t.Errorf("want every rank to complete the all-reduce once the stopped rank went on:\n%s", s)
				}
				if t.Failed() || testing.Verbose() {
					t.Logf("the job ended %v after it started:\n%s", took.Round(time.Millisecond), s)
				}
			})
		}
	}
}

// faultChild is a rank of a job of TestSharedMemoryFaults: fault is the
// name of the fault, and dir a folder for the ranks' notes to each other.
func faultChild(t *testing.T, fault, dir string) {
	if fault != "stuck" {
		// The runtime's SIGTERM (see TestSharedMemoryFaults) is held off.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM)
	}
	o := mpi.Options{Blocking: true, StallInterval: -1}
	if fault == "stuck" {
		o.Timeout = time.Second
	}
	stalls := make(chan comm.Stall, 64)
	if fault == "pause" {
		o.StallInterval = 500 * time.Millisecond
		o.OnStall = func(s comm.Stall) {
			select {
			case stalls <- s:
			default:
			}
		}
	}
	c := open(t, o)
	if comm.HostSourceOf(c) == nil {
		t.Fatalf("rank %d: the ranks do not share memory (%s)", c.Rank(), mpi.LibraryInfo().SharedMemoryFailure)
	}
	n := 1000 // 4 KB: staged
	if fault == "exit" {
		n = 64 << 10 // 256 KiB: direct
	}
	p := newPool(t, comm.HostSourceOf(c))
	b := allocFrom(p)(t, n, comm.Float32)
	v := unsafe.Slice((*float32)(b.Addr), n)
	fill := func() {
		for k := range v {
			v[k] = float32(c.Rank() + 1)
		}
	}
	// One all-reduce first: every rank is past Open and in the segment.
	fill()
	if err := c.AllReduce(b, b, comm.Sum).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	victim := c.Size() - 1
	if fault == "pause" {
		pauseChild(t, c, b, stalls, dir)
		return
	}
	if c.Rank() == victim {
		time.Sleep(100 * time.Millisecond) // the others wait by now
		// The signals go to this thread (tgkill), which so stops or dies
		// before it returns: sent to the process, another thread may take
		// them while this one goes on into the all-reduce.
		self := func(sig syscall.Signal) { syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig) }
		switch fault {
		case "kill":
			self(syscall.SIGKILL)
		case "exit":
			mpi.ExitMidCall(2)
		case "abort":
			// The peers must see the abort with its cause (that they
			// never see it without is comm/shm's TestAbortCause).
			c.Abort(errors.New("injected failure"))
		case "stop", "stuck":
			self(syscall.SIGSTOP)
		case "close":
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			// Alive, so that only the mark of the close can tell the
			// others; their notes say they are done with it.
			for r := range victim {
				waitNote(dir, r)
			}
			os.Exit(0)
		}
	}
	fill()
	w := c.AllReduce(b, b, comm.Sum)
	ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
	defer cancel()
	if fault == "stuck" {
		ctx = context.Background() // the communicator's Timeout ends the job
	}
	t0 := time.Now()
	err := w.Wait(ctx)
	if fault == "stuck" {
		// Only the timeout ends this wait, with MPI_Abort (whose runtime
		// continues the stopped rank before it ends it).
		os.Exit(0)
	}
	if c.Rank() != victim || err != nil {
		fmt.Printf("CHILD: rank %d: waited %v: %v\n", c.Rank(), time.Since(t0).Round(time.Millisecond), err)
	}
	if fault != "stop" {
		if err != nil {
			if fault == "close" {
				writeNote(t, dir, c.Rank())
			}
			os.Exit(0) // a peer is gone: MPI_Finalize could wait for it
		}
		t.Fatalf("rank %d: the all-reduce completed without rank %d", c.Rank(), victim)
	}
	if c.Rank() != victim {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank %d: %v; want the deadline", c.Rank(), err)
		}
		// Every rank that waited says so; then rank 0 continues the
		// stopped one, whose process the error names.
		writeNote(t, dir, c.Rank())
		if c.Rank() == 0 {
			m := regexp.MustCompile(`\(process (\d+), stopped\)`).FindStringSubmatch(err.Error())
			if m == nil {
				t.Fatalf("rank 0: %v names no stopped process", err)
			}
			for r := 1; r < victim; r++ {
				waitNote(dir, r)
			}
			pid, _ := strconv.Atoi(m[1])
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Wait(context.Background()); err != nil {
			t.Fatalf("rank %d: after the stop: %v", c.Rank(), err)
		}
	}
	want := float32(c.Size() * (c.Size() + 1) / 2)
	for k := range v {
		if v[k] != want {
			t.Fatalf("rank %d: element %d is %v; want %v", c.Rank(), k, v[k], want)
		}
	}
	fmt.Println("CHILD: completed after the stop")
}

// writeNote tells the other ranks of a fault job that rank r is done
// waiting; waitNote waits for rank r's note.
func writeNote(t *testing.T, dir string, r int) {
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(r)), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func waitNote(dir string, r int) {
	for _, err := os.Stat(filepath.Join(dir, strconv.Itoa(r))); err != nil; _, err = os.Stat(filepath.Join(dir, strconv.Itoa(r))) {
		time.Sleep(10 * time.Millisecond)
	}
}

// pauseChild is a rank of the pause job (see TestSharedMemoryFaults): the
// last rank issues an all-reduce and stops itself; rank 0 continues it
// 2.5 s later, and joins the all-reduce once the stopped rank has
// reported its stall.
func pauseChild(t *testing.T, c comm.Communicator, b comm.Buffer, stalls <-chan comm.Stall, dir string) {
	victim := c.Size() - 1
	v := unsafe.Slice((*float32)(b.Addr), b.Count)
	for k := range v {
		v[k] = float32(c.Rank() + 1)
	}
	switch c.Rank() {
	case victim:
		w := c.AllReduce(b, b, comm.Sum)
		writeNote(t, dir, os.Getpid()) // the process to continue
		syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
		for n := 0; ; n++ {
			s := <-stalls
			fmt.Printf("CHILD: rank %d stalled: %s\n", c.Rank(), s)
			if strings.Contains(s.Detail, "did not run") {
				break
			}
			if n == 10 {
				t.Errorf("rank %d: %d stall reports, none saying it did not run", c.Rank(), n+1)
				break
			}
		}
		writeNote(t, dir, -1) // reported: rank 0 may join
		if err := w.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	case 0:
		var pid int
		for pid == 0 {
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				pid, _ = strconv.Atoi(e.Name())
			}
			time.Sleep(10 * time.Millisecond)
		}
		for (shm.Ident{Pid: int32(pid)}).State() != shm.Stopped {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2500 * time.Millisecond) // the pause under test
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitNote(dir, -1)
		fallthrough
	default:
		if err := c.AllReduce(b, b, comm.Sum).Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	want := float32(c.Size() * (c.Size() + 1) / 2)
	for k := range v {
		if v[k] != want {
			t.Fatalf("rank %d: element %d is %v; want %v", c.Rank(), k, v[k], want)
		}
	}
	fmt.Println("CHILD: completed after the pause")
}
