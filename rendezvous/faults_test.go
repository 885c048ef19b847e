package rendezvous

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// flakyListener fails its first n Accepts as an exhausted file table does.
type flakyListener struct {
	net.Listener
	n int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.n > 0 {
		l.n--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptErrorsKeepServing: failed Accepts (EMFILE here) do not end
// the server: it backs off and serves the clients that come after.
func TestAcceptErrorsKeepServing(t *testing.T) {
	testutil.NoLeak(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveOn(&flakyListener{Listener: ln, n: 6}, ServerOptions{})
	defer srv.Close()
	s, err := Open(context.Background(), Options{Addr: srv.Addr(), Rank: 1, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Set(context.Background(), "k", []byte("v")); err != nil {
		t.Fatalf("Set after the server's Accept failed 6 times: %v", err)
	}
}

// TestAcceptEMFILE: the server of a process out of file descriptors keeps
// serving once some are free again. In a child process, whose descriptor
// limit the test lowers: it fills the table, connects with the last free
// descriptor (the server's Accept then fails with EMFILE), frees the
// table and expects that connection to be served.
func TestAcceptEMFILE(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the descriptor limit is set through Linux's setrlimit")
	}
	if os.Getenv("DDPGO_TEST_EMFILE") == "1" {
		emfileChild(t)
		return
	}
	out, err := runChild(t, "^TestAcceptEMFILE$", "DDPGO_TEST_EMFILE=1")
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(out, "too many open files") {
		t.Fatalf("the server's Accept never failed with EMFILE, so the test tested nothing:\n%s", out)
	}
}

func emfileChild(t *testing.T) {
	srv, err := Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	failed := make(chan struct{})
	var once sync.Once
	srv.mu.Lock()
	srv.onAcceptError = func(error) { once.Do(func() { close(failed) }) }
	srv.mu.Unlock()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatal("no descriptor free under a limit of 64")
	}
	files[len(files)-1].Close()
	files = files[:len(files)-1]
	c, err := net.Dial("tcp", srv.Addr()) // the last free descriptor
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	<-failed // the server's Accept has failed for want of a descriptor
	for _, f := range files {
		f.Close()
	}
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := rawGreet(c, ""); err != nil {
		t.Fatalf("greeting on a connection made while the server was out of descriptors: %v", err)
	}
	if err := rawSet(c, "k", []byte("v")); err != nil {
		t.Fatalf("Set on a connection made while the server was out of descriptors: %v", err)
	}
}

// rawSet sends a Set on c and reads its answer.
func rawSet(c net.Conn, key string, value []byte) error {
	_, err := rawCall(c, opSet, key, value)
	return err
}

// rawGreet greets on c as a Store with the given secret does.
func rawGreet(c net.Conn, secret string) error {
	if secret == "" {
		_, err := rawCall(c, opHello, "", nil)
		return err
	}
	client := bytes.Repeat([]byte{7}, nonceSize)
	v, err := rawCall(c, opHello, "", client)
	if err != nil {
		return err
	}
	if len(v) != nonceSize+sha256.Size {
		return fmt.Errorf("the server's hello: %d bytes", len(v))
	}
	_, err = rawCall(c, opAuth, "", proof(secret, "client", client, v[:nonceSize]))
	return err
}

// rawCall sends one request on c and reads its answer.
func rawCall(c net.Conn, op byte, key string, value []byte) ([]byte, error) {
	b := []byte{op}
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	b = append(b, value...)
	b = binary.BigEndian.AppendUint64(b, 0)
	if _, err := c.Write(b); err != nil {
		return nil, err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(c, msg); err != nil {
		return nil, err
	}
	if hdr[0] != statusOK {
		return nil, errors.New(string(msg))
	}
	return msg, nil
}

// TestSlowRequestDropped: a request whose bytes trickle in (slow loris) is
// dropped once it has taken RequestTimeout since its first byte, while an
// idle connection stays.
func TestSlowRequestDropped(t *testing.T) {
	testutil.NoLeak(t)
	srv, err := ServeWith("127.0.0.1:0", ServerOptions{RequestTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	idle, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, c := range []net.Conn{idle, c} {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := rawGreet(c, ""); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Time{})
	}
	// Set of a 1000-byte key, one byte every 20 ms: 20 s if it were let.
	hdr := binary.BigEndian.AppendUint32([]byte{opSet}, 1000)
	if _, err := c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	dropped := make(chan error, 1)
	go func() {
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err := io.ReadAll(c)
		dropped <- err
	}()
	sent := 0
	for ; sent < 1000; sent++ {
		if _, err := c.Write([]byte{'k'}); err != nil {
			break
		}
		select {
		case err := <-dropped:
			// Ended: at EOF, or reset, when the server closed with
			// trickled bytes unread. A timeout means it never did.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("waiting for the server to drop the connection: %v", err)
			}
			sent = -1
		case <-time.After(20 * time.Millisecond):
		}
		if sent < 0 {
			break
		}
	}
	if sent >= 0 {
		t.Fatalf("the server took all %d bytes of a request trickled over %v (RequestTimeout 200ms)", sent, 20*time.Duration(sent)*time.Millisecond)
	}
	idle.SetDeadline(time.Now().Add(10 * time.Second))
	if err := rawSet(idle, "k", []byte("v")); err != nil {
		t.Fatalf("a connection idle meanwhile: %v", err)
	}
}

// TestAnnouncedLengthCostsNothing: the server allocates a block's memory as
// its bytes arrive, not when its length is announced: 100 requests that
// announce 1 MiB and send 10 bytes cost far less than 100 MiB.
func TestAnnouncedLengthCostsNothing(t *testing.T) {
	frame := append(binary.BigEndian.AppendUint32(nil, MaxSize), make([]byte, 10)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		if _, err := readBlock(bytes.NewReader(frame), "key", MaxSize); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("a short block: %v, want io.ErrUnexpectedEOF", err)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 10<<20 {
		t.Fatalf("100 announced blocks of 1 MiB with 10 bytes each allocated %d bytes", got)
	}
}

// TestLimits: the store refuses a key or bytes past its limits, naming
// them; replacing a key within them works.
func TestLimits(t *testing.T) {
	testutil.NoLeak(t)
	srv, err := ServeWith("127.0.0.1:0", ServerOptions{MaxKeys: 3, MaxBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	s, err := Open(context.Background(), Options{Addr: srv.Addr(), Rank: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		if err := s.Set(ctx, k, []byte("0123456789")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Add(ctx, "n", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "d", nil); err == nil || !strings.Contains(err.Error(), "over its limits of 3 keys and 100 bytes") {
		t.Fatalf("a fourth key under MaxKeys 3: %v", err)
	}
	if _, err := s.Add(ctx, "e", 1); err == nil || !strings.Contains(err.Error(), "store is full") {
		t.Fatalf("a fourth counter under MaxKeys 3: %v", err)
	}
	if err := s.Set(ctx, "a", make([]byte, 80)); err != nil { // 1+80 + 1+10 + 1+8 = 101 bytes
		if !strings.Contains(err.Error(), "101 bytes") {
			t.Fatalf("past MaxBytes: %v", err)
		}
	} else {
		t.Fatal("Set past MaxBytes succeeded")
	}
	if err := s.Set(ctx, "a", make([]byte, 79)); err != nil {
		t.Fatalf("replacing a key within the limits: %v", err)
	}
	if _, err := s.Add(ctx, "n", 1); err != nil {
		t.Fatalf("adding to a counter of a full store: %v", err)
	}
}

// TestAddRefusesToWrap: Add past the range of int64 fails and leaves the
// counter as it was.
func TestAddRefusesToWrap(t *testing.T) {
	testutil.NoLeak(t)
	ss := open(t, 1)
	ctx := context.Background()
	for _, c := range []struct {
		key          string
		first, delta int64
	}{{"up", math.MaxInt64 - 1, 2}, {"down", math.MinInt64 + 1, -2}, {"max", math.MaxInt64, math.MaxInt64}} {
		if v, err := ss[0].Add(ctx, c.key, c.first); err != nil || v != c.first {
			t.Fatalf("Add(%q, %d) = %d, %v", c.key, c.first, v, err)
		}
		if v, err := ss[0].Add(ctx, c.key, c.delta); err == nil || !strings.Contains(err.Error(), "would wrap") {
			t.Fatalf("Add(%q, %d) to %d = %d, %v; want an error saying it would wrap", c.key, c.delta, c.first, v, err)
		}
		if v, err := ss[0].Add(ctx, c.key, 0); err != nil || v != c.first {
			t.Fatalf("the counter after the refused Add: %d, %v; want %d", v, err, c.first)
		}
	}
}

// TestSecret: with a job secret, only a Store that knows it is served,
// and a Store that has one refuses a server that does not know it.
func TestSecret(t *testing.T) {
	testutil.NoLeak(t)
	ctx := context.Background()
	t.Setenv(SecretEnv, "")
	s0, err := Open(ctx, Options{Addr: "127.0.0.1:0", Rank: 0, Timeout: 10 * time.Second, Secret: "right"})
	if err != nil {
		t.Fatal(err)
	}
	defer s0.Close()
	if err := s0.Set(ctx, "ddpgo/nccl/unique-id", []byte("id")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(SecretEnv, "right") // a rank that has it from the environment
	s1, err := Open(ctx, Options{Addr: s0.Addr(), Rank: 1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if v, err := s1.Get(ctx, "ddpgo/nccl/unique-id"); err != nil || string(v) != "id" {
		t.Fatalf("Get with the secret from %s: %q, %v", SecretEnv, v, err)
	}
	t.Setenv(SecretEnv, "")

	// No secret: refused in Open, by the greeting.
	if _, err := Open(ctx, Options{Addr: s0.Addr(), Rank: 5, Timeout: 10 * time.Second}); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), SecretEnv) {
		t.Fatalf("Open without the secret: %v, want ErrAuth naming %s", err, SecretEnv)
	}
	// A wrong secret: the client sees that the server does not know its
	// secret, and never proves anything.
	if _, err := Open(ctx, Options{Addr: s0.Addr(), Rank: 5, Timeout: 10 * time.Second, Secret: "wrong"}); !errors.Is(err, ErrAuth) {
		t.Fatalf("Open with a wrong secret: %v, want ErrAuth", err)
	}
	// A raw request, without the handshake.
	c, err := net.Dial("tcp", s0.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := rawSet(c, "ddpgo/nccl/unique-id", []byte("evil")); err == nil || !strings.Contains(err.Error(), "Set refused") {
		t.Fatalf("a raw Set without the handshake: %v, want it refused", err)
	}
	if v, err := s1.Get(ctx, "ddpgo/nccl/unique-id"); err != nil || string(v) != "id" {
		t.Fatalf("the id after the strays: %q, %v", v, err)
	}

	// A Store with a secret refuses a server without one.
	open := open(t, 1)
	if _, err := Open(ctx, Options{Addr: open[0].Addr(), Rank: 1, Timeout: 10 * time.Second, Secret: "right"}); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "has no secret") {
		t.Fatalf("Open with a secret against a server without one: %v, want ErrAuth", err)
	}
}

// runChild runs the test binary's test run in a child process with env
// added, and returns its output.
func runChild(t *testing.T, run string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
