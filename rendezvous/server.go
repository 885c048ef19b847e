package rendezvous

import (
	"bufio"
	"container/list"
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
	"syscall"
	"time"
)

// Defaults of ServerOptions.
const (
	DefaultRequestTimeout   = 30 * time.Second
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultMaxPending       = 256
	DefaultMaxKeys          = 4096
	DefaultMaxBytes         = 64 << 20
)

// ServerOptions configures a Server; the zero value gives the defaults
// and no secret.
type ServerOptions struct {
	// Secret, if not empty, is the job's secret: a connection must prove
	// it knows it before any request is served (see the package
	// documentation, "Who may talk to the store").
	Secret string
	// RequestTimeout bounds how long a request may take to arrive once
	// its first byte has, and how long an answer may take to leave. A
	// connection that is slower is dropped. 0 means
	// DefaultRequestTimeout. A connection idle between requests is kept.
	RequestTimeout time.Duration
	// HandshakeTimeout bounds a connection's greeting (Hello, and Auth
	// with a secret) from its accept: a connection that has not greeted
	// by then is dropped. 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxPending caps the connections that have not greeted yet. A
	// connection accepted past it closes the oldest of them, and so does
	// an Accept that fails for want of file descriptors; a Store whose
	// connection was closed that way dials again. 0 means
	// DefaultMaxPending.
	MaxPending int
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
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
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
	conns   map[*peer]struct{}
	pending list.List // of the *peers that have not greeted, oldest first
	evicted int       // connections closed to make room, for tests
	closing chan struct{}
	closed  bool
	wg      sync.WaitGroup

	// Test hooks, set under mu before the event: an Accept, a failed
	// Accept, and a Get or Wait about to be held.
	onAccept      func()
	onAcceptError func(error)
	onHold        func(key string)
}

// peer is one accepted connection.
type peer struct {
	c    net.Conn
	elem *list.Element // in Server.pending until it greets or is evicted; nil after
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
	s := &Server{ln: ln, o: o.withDefaults(), data: map[string][]byte{}, changed: make(chan struct{}), conns: map[*peer]struct{}{}, closing: make(chan struct{})}
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
	for p := range s.conns {
		p.c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// accept serves every connection until Close. An Accept that fails (out
// of file descriptors, a connection reset before it was accepted) does
// not end it: like net/http's Server it backs off, 5 ms doubling up to
// 1 s, and tries again, so that the ranks still to come can connect once
// the cause has passed. Out of descriptors, it first closes the oldest
// connection that has not greeted, if there is one, and tries again at
// once: connections that never greet cannot keep a rank out.
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
			s.mu.Lock()
			hook := s.onAcceptError
			s.mu.Unlock()
			if hook != nil {
				hook(err)
			}
			if outOfDescriptors(err) && s.evictOldest() {
				continue
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
		p := &peer{c: c}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		var old *peer
		if s.pending.Len() >= s.o.MaxPending {
			old = s.unpend(s.pending.Front().Value.(*peer))
		}
		p.elem = s.pending.PushBack(p)
		s.conns[p] = struct{}{}
		s.wg.Add(1)
		hook := s.onAccept
		s.mu.Unlock()
		if old != nil {
			old.c.Close()
		}
		if hook != nil {
			hook()
		}
		go s.serve(p)
	}
}

func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// evictOldest closes the oldest connection that has not greeted, and
// reports whether there was one. Its descriptor is free when it returns.
func (s *Server) evictOldest() bool {
	s.mu.Lock()
	var old *peer
	if e := s.pending.Front(); e != nil {
		old = s.unpend(e.Value.(*peer))
	}
	s.mu.Unlock()
	if old == nil {
		return false
	}
	old.c.Close()
	return true
}

// unpend takes p off the pending list to be closed; its own goroutine
// then finds it gone when it would admit it. The caller holds s.mu.
func (s *Server) unpend(p *peer) *peer {
	s.pending.Remove(p.elem)
	p.elem = nil
	s.evicted++
	return p
}

// admit moves p from the pending connections to the served ones; false
// means it was evicted meanwhile.
func (s *Server) admit(p *peer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.elem == nil {
		return false
	}
	s.pending.Remove(p.elem)
	p.elem = nil
	return true
}

func (s *Server) serve(p *peer) {
	c := p.c
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, p)
		if p.elem != nil {
			s.pending.Remove(p.elem)
			p.elem = nil
		}
		s.mu.Unlock()
		c.Close()
	}()
	var out []byte
	admitted := false
	reply := func(status byte, v []byte) bool {
		out = answer(out[:0], status, v)
		if admitted {
			c.SetWriteDeadline(time.Now().Add(s.o.RequestTimeout))
		}
		_, err := c.Write(out)
		return err == nil
	}
	// The greeting as a whole is bounded, from the accept, and read
	// without a buffer: the server reads no byte past a frame it refuses.
	c.SetDeadline(time.Now().Add(s.o.HandshakeTimeout))
	if !s.greet(p, reply) {
		return
	}
	admitted = true
	r := bufio.NewReader(c)
	for {
		c.SetReadDeadline(time.Time{}) // idle between requests
		if _, err := r.Peek(1); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(s.o.RequestTimeout))
		op, key, value, wait, err := readRequest(r, MaxSize)
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

// The greeting: every connection begins with opHello. Without a secret
// its value is empty and the answer too. With one, the client sends a
// nonce of its own; the server answers with its nonce and a proof that it
// knows the secret; the client checks it and sends opAuth with its own
// proof. Only proofs travel, never the secret.
const nonceSize = 32

func proof(secret string, who string, client, server []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("ddpgo rendezvous " + who))
	m.Write(client)
	m.Write(server)
	return m.Sum(nil)
}

// greet runs the server's side of the greeting and admits p; on failure
// it answers why, where there is someone to answer, and returns false.
//
// Every frame of the greeting is checked as it is read: its op before its
// lengths, each length before the bytes it announces. A peer that has not
// greeted makes the server read at most greetingFrame bytes of each of
// its (at most two) frames, and allocate one buffer of that size for each.
func (s *Server) greet(p *peer, reply func(byte, []byte) bool) bool {
	refuse := func(status byte, format string, args ...any) bool {
		reply(status, fmt.Appendf(nil, format, args...))
		return false
	}
	client, err := readGreeting(p.c, opHello)
	var op wrongOp
	switch {
	case errors.As(err, &op) && s.o.Secret != "":
		return refuse(statusAuth, "%s refused: this store needs the job's secret (Options.Secret, or %s in the environment of every rank)", opName(byte(op)), SecretEnv)
	case errors.As(err, &op):
		return refuse(statusError, "rendezvous: %s before the greeting: a connection begins with Hello (is the client this version's rendezvous Store?)", opName(byte(op)))
	case quiet(err):
		return false
	case err != nil:
		return refuse(statusError, "rendezvous: the greeting: %v", err)
	case len(client) != 0 && len(client) != nonceSize:
		return refuse(statusError, "rendezvous: the greeting: a nonce of %d bytes, want %d", len(client), nonceSize)
	case s.o.Secret == "" && len(client) != 0:
		// A client with a secret, and a server without one: not this
		// job's store, or a store that anyone may write.
		return refuse(statusAuth, "the store has no secret, and this client has one: is it the job's store? Give its server the same secret")
	case s.o.Secret != "" && len(client) == 0:
		return refuse(statusAuth, "the client has no secret; this store needs the job's secret (Options.Secret, or %s in the environment of every rank)", SecretEnv)
	case s.o.Secret == "":
		return s.admit(p) && reply(statusOK, nil)
	}
	server := make([]byte, nonceSize)
	rand.Read(server)
	if !reply(statusOK, append(server, proof(s.o.Secret, "server", client, server)...)) {
		return false
	}
	pr, err := readGreeting(p.c, opAuth)
	switch {
	case errors.As(err, &op) || err == nil && !hmac.Equal(pr, proof(s.o.Secret, "client", client, server)):
		return refuse(statusAuth, "the client's secret is not the store's (Options.Secret, or %s in the environment of every rank)", SecretEnv)
	case quiet(err):
		return false
	case err != nil:
		return refuse(statusError, "rendezvous: the secret's handshake: %v", err)
	}
	return s.admit(p) && reply(statusOK, nil)
}

// quiet reports whether a read of the greeting failed because the peer
// left, the connection was closed here, or the greeting's time is up: a
// peer that has not greeted gets no answer then.
func quiet(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout()
}

// greetingFrame is the most the server reads of one frame of the
// greeting: op, two lengths, an empty key, a nonce or a proof (both
// nonceSize bytes) and the wait.
const greetingFrame = 1 + 4 + 4 + nonceSize + 8

// wrongOp is the op of a greeting frame that is not the one expected.
type wrongOp byte

func (op wrongOp) Error() string { return opName(byte(op)) + " during the greeting" }

// readGreeting reads one frame of the greeting, which must carry op want,
// an empty key and a value of at most nonceSize bytes. The frame is read
// into one buffer of greetingFrame bytes, its only allocation, and the
// value returned is part of it.
func readGreeting(r io.Reader, want byte) ([]byte, error) {
	b := new([greetingFrame]byte)
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return nil, err
	}
	if b[0] != want {
		return nil, wrongOp(b[0])
	}
	if _, err := io.ReadFull(r, b[1:5]); err != nil {
		return nil, err
	}
	if l := binary.BigEndian.Uint32(b[1:5]); l != 0 {
		return nil, blockTooLong("key", l, 0)
	}
	if _, err := io.ReadFull(r, b[5:9]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(b[5:9])
	if l > nonceSize {
		return nil, blockTooLong("value", l, nonceSize)
	}
	value := b[9 : 9+l]
	if _, err := io.ReadFull(r, value); err != nil {
		if err == io.EOF {
			// The length was read: the value is cut short, as readBlock
			// reports it.
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	// The wait, which a greeting does not use.
	if _, err := io.ReadFull(r, b[9+l:9+l+8]); err != nil {
		return nil, err
	}
	return value, nil
}

// readRequest reads one request whose key and value are at most max bytes
// each.
func readRequest(r io.Reader, max uint32) (op byte, key string, value []byte, wait time.Duration, err error) {
	var b [1]byte
	if _, err = io.ReadFull(r, b[:]); err != nil {
		return
	}
	key, value, wait, err = readBody(r, max, max)
	return b[0], key, value, wait, err
}

// readBody reads a frame after its op.
func readBody(r io.Reader, maxKey, maxValue uint32) (key string, value []byte, wait time.Duration, err error) {
	var k []byte
	if k, err = readBlock(r, "key", maxKey); err != nil {
		return
	}
	if value, err = readBlock(r, "value", maxValue); err != nil {
		return
	}
	var w [8]byte
	if _, err = io.ReadFull(r, w[:]); err != nil {
		return
	}
	return string(k), value, time.Duration(binary.BigEndian.Uint64(w[:])), nil
}

// readBlock reads a length and that many bytes, refusing a length past
// max before reading on. Memory grows as the bytes arrive, never on the
// length's word alone: a client that announces a large block and sends
// nothing costs nothing.
func readBlock(r io.Reader, what string, max uint32) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(n[:])
	if l > max {
		return nil, blockTooLong(what, l, max)
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(l)))
	if err == nil && len(b) < int(l) {
		err = io.ErrUnexpectedEOF
	}
	return b, err
}

// blockTooLong is the error of a block whose announced length l passes
// max.
func blockTooLong(what string, l, max uint32) error {
	return fmt.Errorf("a %s of %d bytes (at most %d)", what, l, max)
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
		hook := s.onHold
		s.mu.Unlock()
		if ok {
			return v, true
		}
		if t == nil {
			t = time.NewTimer(wait)
			if hook != nil {
				hook(key)
			}
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
