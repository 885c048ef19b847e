package rendezvous

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"sync"
	"time"
)

// Defaults of ServerOptions.
const (
	DefaultRequestTimeout = 30 * time.Second
	DefaultMaxKeys        = 4096
	DefaultMaxBytes       = 64 << 20
)

// ServerOptions configures a Server; the zero value gives the defaults
// and no secret.
type ServerOptions struct {
	// Secret, if not empty, is the job's secret: a connection must prove
	// it knows it before any request is served (see the package
	// documentation, "Who may talk to the store").
	Secret string
	// RequestTimeout bounds how long a request may take to arrive once
	// its first byte has (and the secret's handshake, from the
	// connection's start), and how long an answer may take to leave. A
	// connection that is slower is dropped. 0 means
	// DefaultRequestTimeout. A connection idle between requests is kept.
	RequestTimeout time.Duration
	// MaxKeys and MaxBytes bound what the store holds: the number of
	// keys, and the bytes of keys and values together. A Set or Add that
	// would pass either fails. 0 means DefaultMaxKeys, DefaultMaxBytes.
	MaxKeys  int
	MaxBytes int64
}

func (o ServerOptions) withDefaults() ServerOptions {
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	return o
}

// Server serves the store to the ranks' Stores. Open starts one on rank
// 0; Serve starts one on its own (for a launcher that runs it apart from
// the ranks). It owns one goroutine per connection and one accepting;
// Close stops them all.
type Server struct {
	ln net.Listener
	o  ServerOptions

	mu      sync.Mutex
	data    map[string][]byte
	bytes   int64         // of the keys and values in data
	changed chan struct{} // closed and replaced on every change
	conns   map[net.Conn]struct{}
	closing chan struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves
// the store until Close, with the default ServerOptions.
func Serve(addr string) (*Server, error) { return ServeWith(addr, ServerOptions{}) }

// ServeWith is Serve with options.
func ServeWith(addr string, o ServerOptions) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: serving the store on %s: %w", addr, err)
	}
	return serveOn(ln, o), nil
}

// serveOn serves the store on ln.
func serveOn(ln net.Listener, o ServerOptions) *Server {
	s := &Server{ln: ln, o: o.withDefaults(), data: map[string][]byte{}, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, closing: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server: it closes the listener and every connection and
// waits for its goroutines. Calls held waiting fail on their clients.
// Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// accept serves every connection until Close. An Accept that fails (out
// of file descriptors, a connection reset before it was accepted) does
// not end it: like net/http's Server it backs off, 5 ms doubling up to
// 1 s, and tries again, so that the ranks still to come can connect once
// the cause has passed.
func (s *Server) accept() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			select {
			case <-s.closing:
				return
			default:
			}
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else {
				delay = min(2*delay, time.Second)
			}
			log.Printf("rendezvous: the store at %s: accepting a connection: %v; trying again in %v", s.Addr(), err, delay)
			t := time.NewTimer(delay)
			select {
			case <-s.closing:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		delay = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReader(c)
	var out []byte
	reply := func(status byte, v []byte) bool {
		out = answer(out[:0], status, v)
		c.SetWriteDeadline(time.Now().Add(s.o.RequestTimeout))
		_, err := c.Write(out)
		return err == nil
	}
	if s.o.Secret != "" {
		// The handshake as a whole is bounded, from the start.
		c.SetReadDeadline(time.Now().Add(s.o.RequestTimeout))
		if status, err := s.handshake(r, reply); err != nil {
			reply(status, []byte(err.Error()))
			return
		}
	}
	for {
		c.SetReadDeadline(time.Time{}) // idle between requests
		if _, err := r.Peek(1); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(s.o.RequestTimeout))
		op, key, value, wait, err := readRequest(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = fmt.Errorf("the request did not arrive within %v of its first byte", s.o.RequestTimeout)
				}
				reply(statusError, []byte("rendezvous: bad request: "+err.Error()))
			}
			return
		}
		status, v := s.do(op, key, value, wait)
		if !reply(status, v) {
			return
		}
	}
}

// The secret's handshake: the client sends opHello with a nonce of its
// own; the server answers with its nonce and a proof that it knows the
// secret; the client checks it and sends opAuth with its own proof. Only
// proofs travel, never the secret.
const nonceSize = 32

func proof(secret string, who string, client, server []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ddpgo rendezvous " + who))
	m.Write(client)
	m.Write(server)
	return m.Sum(nil)
}

// handshake runs the server's side; on failure it returns the status and
// the message to answer with.
func (s *Server) handshake(r *bufio.Reader, reply func(byte, []byte) bool) (byte, error) {
	op, _, client, _, err := readRequest(r)
	switch {
	case err != nil:
		return statusError, fmt.Errorf("rendezvous: the secret's handshake: %v", err)
	case op != opHello:
		return statusAuth, fmt.Errorf("%s refused: this store needs the job's secret (Options.Secret, or %s in the environment of every rank)", opName(op), SecretEnv)
	case len(client) != nonceSize:
		return statusError, fmt.Errorf("rendezvous: the secret's handshake: a nonce of %d bytes, want %d", len(client), nonceSize)
	}
	server := make([]byte, nonceSize)
	rand.Read(server)
	if !reply(statusOK, append(server, proof(s.o.Secret, "server", client, server)...)) {
		return statusError, errors.New("rendezvous: the secret's handshake: answering the hello failed")
	}
	op, _, p, _, err := readRequest(r)
	switch {
	case err != nil:
		return statusError, fmt.Errorf("rendezvous: the secret's handshake: %v", err)
	case op != opAuth || !hmac.Equal(p, proof(s.o.Secret, "client", client, server)):
		return statusAuth, fmt.Errorf("the client's secret is not the store's (Options.Secret, or %s in the environment of every rank)", SecretEnv)
	}
	if !reply(statusOK, nil) {
		return statusError, errors.New("rendezvous: the secret's handshake: answering the proof failed")
	}
	return statusOK, nil
}

func readRequest(r *bufio.Reader) (op byte, key string, value []byte, wait time.Duration, err error) {
	if op, err = r.ReadByte(); err != nil {
		return
	}
	var k []byte
	if k, err = readBlock(r); err != nil {
		return
	}
	if value, err = readBlock(r); err != nil {
		return
	}
	var w [8]byte
	if _, err = io.ReadFull(r, w[:]); err != nil {
		return
	}
	return op, string(k), value, time.Duration(binary.BigEndian.Uint64(w[:])), nil
}

// readBlock reads a length and that many bytes. Memory grows as the bytes
// arrive, never on the length's word alone: a client that announces a
// large block and sends nothing costs nothing.
func readBlock(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(n[:])
	if l > MaxSize {
		return nil, fmt.Errorf("block of %d bytes (at most %d)", l, MaxSize)
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(l)))
	if err == nil && len(b) < int(l) {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

func answer(b []byte, status byte, v []byte) []byte {
	b = append(b, status)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

func (s *Server) do(op byte, key string, value []byte, wait time.Duration) (byte, []byte) {
	switch op {
	case opSet:
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.room(key, len(value)); err != nil {
			return statusError, []byte(fmt.Sprintf("rendezvous: Set(%q): %v", trim(key), err))
		}
		s.put(key, value)
		return statusOK, nil
	case opAdd:
		if len(value) != 8 {
			return statusError, []byte(fmt.Sprintf("rendezvous: Add(%q) with a delta of %d bytes", trim(key), len(value)))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		var cur int64
		if old, ok := s.data[key]; ok {
			if len(old) != 8 {
				return statusError, []byte(fmt.Sprintf("rendezvous: Add(%q): the key holds %d bytes set by Set, not a counter", trim(key), len(old)))
			}
			cur = int64(binary.BigEndian.Uint64(old))
		}
		delta := int64(binary.BigEndian.Uint64(value))
		if delta > 0 && cur > math.MaxInt64-delta || delta < 0 && cur < math.MinInt64-delta {
			return statusError, []byte(fmt.Sprintf("rendezvous: Add(%q, %d): the counter holds %d, and the sum would wrap past the range of int64", trim(key), delta, cur))
		}
		if err := s.room(key, 8); err != nil {
			return statusError, []byte(fmt.Sprintf("rendezvous: Add(%q): %v", trim(key), err))
		}
		nv := binary.BigEndian.AppendUint64(nil, uint64(cur+delta))
		s.put(key, nv)
		return statusOK, nv
	case opGet, opWait:
		v, ok := s.await(key, wait)
		if !ok {
			return statusTimeout, []byte(fmt.Sprintf("key %q not set within %v", trim(key), wait))
		}
		if op == opWait {
			v = nil
		}
		return statusOK, v
	case opHello:
		// A client with a secret, and a server without one: not this
		// job's store, or a store that anyone may write.
		return statusAuth, []byte("the store has no secret, and this client has one: is it the job's store? Give its server the same secret")
	}
	return statusError, []byte(fmt.Sprintf("rendezvous: unknown operation %d", op))
}

// room fails if storing n bytes under key would pass the store's limits.
// The caller holds s.mu.
func (s *Server) room(key string, n int) error {
	keys, bytes := len(s.data), s.bytes+int64(n)
	if old, ok := s.data[key]; ok {
		bytes -= int64(len(old))
	} else {
		keys++
		bytes += int64(len(key))
	}
	if keys > s.o.MaxKeys || bytes > s.o.MaxBytes {
		return fmt.Errorf("the store is full: it would hold %d keys and %d bytes, over its limits of %d keys and %d bytes (ServerOptions.MaxKeys, MaxBytes)",
			keys, bytes, s.o.MaxKeys, s.o.MaxBytes)
	}
	return nil
}

// put stores value under key and wakes the held Gets and Waits. The
// caller holds s.mu and has checked room.
func (s *Server) put(key string, value []byte) {
	if old, ok := s.data[key]; ok {
		s.bytes -= int64(len(old))
	} else {
		s.bytes += int64(len(key))
	}
	s.bytes += int64(len(value))
	s.data[key] = value
	close(s.changed)
	s.changed = make(chan struct{})
}

// await returns key's value once it exists, or false after wait or when
// the server closes.
func (s *Server) await(key string, wait time.Duration) ([]byte, bool) {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		s.mu.Lock()
		v, ok := s.data[key]
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return v, true
		}
		if t == nil {
			t = time.NewTimer(wait)
		}
		select {
		case <-ch:
		case <-t.C:
			return nil, false
		case <-s.closing:
			return nil, false
		}
	}
}
