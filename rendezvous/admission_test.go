package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// What a connection that has not greeted may cost the server: a few
// seconds, a few dozen bytes, and its place among MaxPending others.

// frame encodes one request as a Store sends it.
func frame(op byte, key string, value []byte) []byte {
	b := []byte{op}
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	b = append(b, value...)
	return binary.BigEndian.AppendUint64(b, 0)
}

// header is the start of a frame that announces a key and a value of the
// given lengths, without them.
func header(op byte, keyLen, valueLen uint32) []byte {
	b := binary.BigEndian.AppendUint32([]byte{op}, keyLen)
	return binary.BigEndian.AppendUint32(b, valueLen)
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestGreetingReadsNoFurther: a greeting frame is refused on the word
// that makes it wrong (its op, a length), before the bytes after it are
// read, and a refused frame allocates next to nothing whatever it
// announces and carries.
func TestGreetingReadsNoFurther(t *testing.T) {
	body := make([]byte, 2<<20)
	cases := []struct {
		name  string
		frame []byte
		read  int // at most, of the frame
		err   string
	}{
		{"a 2 MiB value", header(opHello, 0, 2<<20), 9, "a value of 2097152 bytes (at most 32)"},
		{"a 1 MiB key", header(opHello, 1<<20, 1<<20), 5, "a key of 1048576 bytes (at most 0)"},
		{"a value of 33 bytes", header(opHello, 0, 33), 9, "a value of 33 bytes"},
		{"a Set", header(opSet, 1<<20, 1<<20), 1, "Set during the greeting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 100 {
				r := &countingReader{r: io.MultiReader(bytes.NewReader(c.frame), bytes.NewReader(body))}
				_, err := readGreeting(r, opHello)
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("readGreeting: %v, want an error with %q", err, c.err)
				}
				if r.n > c.read {
					t.Fatalf("readGreeting read %d bytes of a frame refused on its first %d", r.n, c.read)
				}
			}
			runtime.ReadMemStats(&after)
			if got := after.TotalAlloc - before.TotalAlloc; got > 100*1024 {
				t.Fatalf("100 refused greeting frames allocated %d bytes", got)
			}
		})
	}
}

// TestGreetingAllocatesOneFrame: a valid greeting frame allocates one
// buffer of greetingFrame bytes (64 in the runtime's size classes), as
// the package doc says, whatever its value; one cut short in its value fails with
// io.ErrUnexpectedEOF, not io.EOF, which would read as a peer that left
// before its frame.
func TestGreetingAllocatesOneFrame(t *testing.T) {
	const frames = 1000
	nonce := bytes.Repeat([]byte{7}, nonceSize)
	for _, c := range []struct {
		name  string
		op    byte
		value []byte
	}{
		{"a Hello without a secret", opHello, nil},
		{"a Hello with a nonce", opHello, nonce},
		{"an Auth with a proof", opAuth, nonce},
	} {
		t.Run(c.name, func(t *testing.T) {
			stream := bytes.Repeat(frame(c.op, "", c.value), frames)
			r := bytes.NewReader(stream)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range frames {
				v, err := readGreeting(r, c.op)
				if err != nil || !bytes.Equal(v, c.value) {
					t.Fatalf("readGreeting: %x, %v; want %x", v, err, c.value)
				}
			}
			runtime.ReadMemStats(&after)
			// A little room for what the runtime allocates meanwhile.
			if got, most := after.TotalAlloc-before.TotalAlloc, uint64(frames*64+16<<10); got > most {
				t.Fatalf("%d greeting frames allocated %d bytes (%d a frame), want at most %d", frames, got, got/frames, most)
			}
		})
	}
	for _, sent := range []int{0, 10} {
		f := append(header(opHello, 0, nonceSize), nonce[:sent]...)
		if _, err := readGreeting(bytes.NewReader(f), opHello); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("a Hello announcing a nonce and carrying %d bytes of it: %v, want io.ErrUnexpectedEOF", sent, err)
		}
	}
}

// TestGreetingRefusedOnItsHeader: over the network, a Hello that
// announces a large key is answered at once, naming the limit; the server
// does not wait for the body.
func TestGreetingRefusedOnItsHeader(t *testing.T) {
	testutil.NoLeak(t)
	for _, secret := range []string{"", "job"} {
		srv, err := ServeWith("127.0.0.1:0", ServerOptions{Secret: secret, HandshakeTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(header(opHello, MaxSize, MaxSize)); err != nil {
			t.Fatal(err)
		}
		// The answer, then EOF, or a reset: the server closes with the
		// rest of the header unread. Not a timeout.
		answer, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || !bytes.Contains(answer, []byte("a key of 1048576 bytes (at most 0)")) {
			t.Fatalf("secret %q: a Hello announcing a 1 MiB key: answer %q, %v", secret, answer, err)
		}
	}
}

// TestGreetingDeadline: a connection that does not greet is dropped
// HandshakeTimeout after its accept, with a secret or without; one that
// has greeted may then stay idle.
func TestGreetingDeadline(t *testing.T) {
	for _, secret := range []string{"", "job"} {
		synctest.Test(t, func(t *testing.T) {
			ln := newPipeListener()
			srv := serveOn(ln, ServerOptions{Secret: secret})
			defer srv.Close()
			start := time.Now()
			idle, greeted := ln.dial(), ln.dial()
			defer idle.Close()
			defer greeted.Close()
			if err := rawGreet(greeted, secret); err != nil {
				t.Fatal(err)
			}
			if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
				t.Fatalf("reading a connection that never greeted: %v, want EOF", err)
			}
			if d := time.Since(start); d != DefaultHandshakeTimeout {
				t.Fatalf("a connection that never greeted was dropped after %v, want %v", d, DefaultHandshakeTimeout)
			}
			time.Sleep(DefaultRequestTimeout) // idle, in the bubble's clock
			if err := rawSet(greeted, "k", nil); err != nil {
				t.Fatalf("a greeted connection idle for %v: %v", DefaultRequestTimeout, err)
			}
		})
	}
}

// TestRankGetsInPastIdleAndHostile: a rank gets in, at once, while 1,000
// connections that never greet are open: idle, a Hello that announces 1
// MiB, a Hello cut short, bytes at random. The server keeps at most
// MaxPending of them.
func TestRankGetsInPastIdleAndHostile(t *testing.T) {
	const n = 1000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 2*n+256 {
		t.Skipf("needs %d file descriptors (RLIMIT_NOFILE %d, %v)", 2*n+256, lim.Cur, err)
	}
	hostile := [][]byte{
		nil,
		header(opHello, MaxSize, MaxSize),
		append(header(opHello, 0, nonceSize), 1, 2, 3),
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
	}
	for _, secret := range []string{"", "job"} {
		t.Run("secret="+secret, func(t *testing.T) {
			testutil.NoLeak(t)
			ctx := context.Background()
			s0, err := Open(ctx, Options{Addr: "127.0.0.1:0", Rank: 0, Secret: secret, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s0.Close()
			for i := range n {
				c, err := net.Dial("tcp", s0.Addr())
				if err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
				defer c.Close()
				c.Write(hostile[i%len(hostile)]) // the server may have closed it already
			}
			s1, err := Open(ctx, Options{Addr: s0.Addr(), Rank: 1, Secret: secret, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatalf("rank 1 past %d connections that never greet: %v", n, err)
			}
			defer s1.Close()
			if err := s1.Set(ctx, "k", []byte("v")); err != nil {
				t.Fatal(err)
			}
			if v, err := s0.Get(ctx, "k"); err != nil || string(v) != "v" {
				t.Fatalf("Get = %q, %v", v, err)
			}
			// Rank 1's connection came after the n others: the server has
			// accepted them all.
			srv := s0.server
			srv.mu.Lock()
			pending, evicted := srv.pending.Len(), srv.evicted
			srv.mu.Unlock()
			if pending > DefaultMaxPending {
				t.Fatalf("%d connections that have not greeted are kept, past MaxPending %d", pending, DefaultMaxPending)
			}
			t.Logf("%d pending, %d closed to make room", pending, evicted)
		})
	}
}

// TestRankGetsInOutOfDescriptors: a rank gets in while connections that
// never greet hold every descriptor of the server's process but one: the
// server, out of descriptors, closes the oldest of them. In a child
// process, whose descriptor limit the test lowers.
func TestRankGetsInOutOfDescriptors(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the descriptor limit is set through Linux's setrlimit")
	}
	if os.Getenv("DDPGO_TEST_NOFILE") == "1" {
		outOfDescriptorsChild(t)
		return
	}
	if out, err := runChild(t, "^TestRankGetsInOutOfDescriptors$", "DDPGO_TEST_NOFILE=1"); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func outOfDescriptorsChild(t *testing.T) {
	ctx := context.Background()
	// Connections that never greet stay for a minute: only the room
	// the server makes when out of descriptors lets rank 1 in.
	srv, err := ServeWith("127.0.0.1:0", ServerOptions{Secret: "job", HandshakeTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	accepted := make(chan struct{}, 1024)
	srv.mu.Lock()
	srv.onAccept = func() { accepted <- struct{}{} }
	srv.mu.Unlock()

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 128
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	spare, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			if !errors.Is(err, syscall.EMFILE) {
				t.Fatalf("filling the descriptor table: %v", err)
			}
			break
		}
		idle = append(idle, c)
	}
	// Every connection dialed is accepted (none is left waiting to take
	// the descriptor freed next); the server made room for the later ones
	// by closing earlier ones.
	for i := range idle {
		select {
		case <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatalf("out of descriptors, the server accepted %d of %d connections that never greet", i, len(idle))
		}
	}
	spare.Close() // the one descriptor left, for rank 1
	s1, err := Open(ctx, Options{Addr: srv.Addr(), Rank: 1, Secret: "job", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("rank 1, with %d connections that never greet holding every other descriptor: %v", len(idle), err)
	}
	defer s1.Close()
	if err := s1.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	evicted := srv.evicted
	srv.mu.Unlock()
	if evicted == 0 {
		t.Fatal("the server closed no connection to make room: the test tested nothing")
	}
	t.Logf("%d idle connections; %d closed to make room", len(idle), evicted)
}

// FuzzServer sends arbitrary bytes to a server: from the start of a
// connection to a server with a secret (mode 0: a peer that cannot
// authenticate), after the secret's handshake (mode 1), and from the start
// to a server without one (mode 2, where the bytes may greet). Nothing
// panics, Close ends every connection, and in mode 0 the server reads at
// most two greeting frames and drops the connection on its own.
func FuzzServer(f *testing.F) {
	hello := frame(opHello, "", nil)
	f.Add([]byte{}, uint8(0))
	f.Add(header(opHello, MaxSize, MaxSize), uint8(0))
	f.Add(frame(opHello, strings.Repeat("k", 100), make([]byte, nonceSize)), uint8(0))
	f.Add(frame(opHello, "", make([]byte, nonceSize)), uint8(0))
	f.Add(append(frame(opHello, "", make([]byte, nonceSize)), frame(opAuth, "", make([]byte, nonceSize))...), uint8(0))
	f.Add(frame(opSet, "k", []byte("v")), uint8(0))
	f.Add(append(frame(opSet, "k", []byte("v")), frame(opGet, "k", nil)...), uint8(1))
	f.Add(append(frame(opAdd, "n", make([]byte, 8)), frame(opAdd, "n", []byte{1})...), uint8(1))
	f.Add(frame(opWait, "never", nil), uint8(1))
	f.Add(header(opSet, MaxSize+1, 0), uint8(1))
	f.Add(append(hello, frame(opSet, "k", []byte("v"))...), uint8(2))
	f.Add(append(hello, hello...), uint8(2))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, mode uint8) {
		mode %= 3
		o := ServerOptions{Secret: "job"}
		switch mode {
		case 0:
			o.HandshakeTimeout = 10 * time.Millisecond
		case 2:
			o.Secret = ""
		}
		ln := newPipeListener()
		srv := serveOn(ln, o)
		defer srv.Close()
		holding := held(srv)
		c := ln.dial()
		defer c.Close()
		if mode == 1 {
			if err := rawGreet(c, o.Secret); err != nil {
				t.Fatal(err)
			}
		}
		drained := make(chan struct{})
		go func() {
			io.Copy(io.Discard, c)
			close(drained)
		}()
		wrote := make(chan int, 1)
		go func() {
			n, _ := c.Write(data)
			wrote <- n
		}()
		var n int
		select {
		case n = <-wrote:
		case <-holding: // a Get or Wait held as long as the bytes asked
		}
		if mode == 0 {
			select {
			case <-drained:
			case <-time.After(10 * time.Second):
				t.Fatalf("the server kept a connection that cannot authenticate open, after %d of %d bytes", n, len(data))
			}
			if n > 2*greetingFrame {
				t.Fatalf("the server read %d bytes from a peer that cannot authenticate, more than two greeting frames (%d)", n, 2*greetingFrame)
			}
		}
		srv.Close()
		<-drained
	})
}

// pipeListener serves in-memory connections (net.Pipe), which work in a
// synctest bubble.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}
}

// dial returns the client's end of a new connection, once the server has
// accepted it.
func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
