package rendezvous

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// DefaultTimeout bounds a Store's calls whose context has no deadline.
const DefaultTimeout = 10 * time.Minute

// MaxSize bounds keys and values, in bytes.
const MaxSize = 1 << 20

// Sentinel errors; test with errors.Is.
var (
	// ErrTimeout: a key did not appear, or the server did not answer,
	// within the deadline.
	ErrTimeout = errors.New("rendezvous: timed out")
	// ErrClosed: the Store or Server was closed.
	ErrClosed = errors.New("rendezvous: closed")
	// ErrInvalid: a bad argument (key or value too large, bad address,
	// bad environment).
	ErrInvalid = errors.New("rendezvous: invalid argument")
	// ErrAuth: the job's secret did not match: the server does not know
	// this Store's secret, or the Store's secret (or its lack of one)
	// is not the server's.
	ErrAuth = errors.New("rendezvous: wrong secret")
)

const (
	opSet byte = iota + 1
	opGet
	opAdd
	opWait
	opHello // the secret's handshake (server.go)
	opAuth
)

// SecretEnv is the environment variable that holds the job's secret when
// Options.Secret is empty.
const SecretEnv = "DDPGO_STORE_SECRET"

// Options configures Open.
type Options struct {
	// Addr is the store's address, host:port. FromEnv builds it from
	// MASTER_ADDR and MASTER_PORT.
	Addr string
	// Rank is this process's rank; rank 0 serves the store.
	Rank int
	// Size is the number of ranks (WORLD_SIZE); it is recorded for the
	// caller, the store does not need it.
	Size int
	// Timeout bounds every call whose context has no deadline, and the
	// time a rank other than 0 keeps trying to reach rank 0's server.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// Secret is the job's secret; empty means the value of SecretEnv,
	// and if that is empty too, none. With a secret, rank 0's server
	// serves only connections that prove they know it, and every rank
	// checks that the server knows it too (package documentation, "Who
	// may talk to the store"). Every rank must have the same secret.
	Secret string
}

// FromEnv reads torchrun's variables: MASTER_ADDR (default "127.0.0.1"),
// MASTER_PORT (required), RANK and WORLD_SIZE (required), and the job's
// secret from SecretEnv (optional).
func FromEnv() (Options, error) {
	o := Options{Secret: os.Getenv(SecretEnv)}
	host := os.Getenv("MASTER_ADDR")
	if host == "" {
		host = "127.0.0.1"
	}
	port := os.Getenv("MASTER_PORT")
	if port == "" {
		return o, fmt.Errorf("%w: MASTER_PORT is not set (torchrun and the launcher set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)", ErrInvalid)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return o, fmt.Errorf("%w: MASTER_PORT=%q is not a port number", ErrInvalid, port)
	}
	var err error
	if o.Rank, err = envInt("RANK"); err != nil {
		return o, err
	}
	if o.Size, err = envInt("WORLD_SIZE"); err != nil {
		return o, err
	}
	if o.Size < 1 || o.Rank < 0 || o.Rank >= o.Size {
		return o, fmt.Errorf("%w: RANK=%d is not in [0, WORLD_SIZE=%d)", ErrInvalid, o.Rank, o.Size)
	}
	o.Addr = net.JoinHostPort(host, port)
	return o, nil
}

func envInt(name string) (int, error) {
	s := os.Getenv(name)
	if s == "" {
		return 0, fmt.Errorf("%w: %s is not set", ErrInvalid, name)
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrInvalid, name, s)
	}
	return v, nil
}

// Store is one rank's handle on the store: a client connection, and on
// rank 0 the server too. Its methods are safe for concurrent use; calls
// are sent one at a time.
type Store struct {
	opts    Options
	server  *Server // rank 0 only
	mu      sync.Mutex
	conn    net.Conn
	r       *bufio.Reader
	closed  bool
	scratch []byte
}

// Open returns rank o.Rank's Store. Rank 0 first starts the server on
// o.Addr; every rank then connects and greets, retrying until rank 0's
// server is up and has greeted it, or ctx (or o.Timeout) ends. A wrong
// secret, or a server that does not know this one, fails at once with
// ErrAuth.
func Open(ctx context.Context, o Options) (*Store, error) {
	if o.Timeout < 0 {
		return nil, fmt.Errorf("%w: Options.Timeout %v is negative", ErrInvalid, o.Timeout)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Secret == "" {
		o.Secret = os.Getenv(SecretEnv)
	}
	if o.Addr == "" {
		return nil, fmt.Errorf("%w: Options.Addr is empty", ErrInvalid)
	}
	s := &Store{opts: o}
	if o.Rank == 0 {
		srv, err := ServeWith(o.Addr, ServerOptions{Secret: o.Secret})
		if err != nil {
			return nil, fmt.Errorf("rendezvous: rank 0: %w", err)
		}
		s.server = srv
		s.opts.Addr = srv.Addr()
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.dial(ctx); err != nil {
		if s.server != nil {
			s.server.Close()
		}
		return nil, err
	}
	return s, nil
}

// Addr returns the server's address (on rank 0, the address it listens
// on, which names the port when Options.Addr asked for port 0).
func (s *Store) Addr() string { return s.opts.Addr }

// Rank returns the rank the Store was opened for.
func (s *Store) Rank() int { return s.opts.Rank }

// Size returns Options.Size.
func (s *Store) Size() int { return s.opts.Size }

// Set stores value under key, replacing any earlier value, and wakes the
// ranks waiting for it.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	_, err := s.call(ctx, opSet, key, value)
	return err
}

// Get returns the value of key, waiting until some rank has set it.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	return s.call(ctx, opGet, key, nil)
}

// Wait returns once every key exists.
func (s *Store) Wait(ctx context.Context, keys ...string) error {
	for _, k := range keys {
		if _, err := s.call(ctx, opWait, k, nil); err != nil {
			return err
		}
	}
	return nil
}

// Add adds delta to the integer stored under key (0 if absent) and returns
// the sum, atomically with respect to every other rank's Add.
func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(delta))
	v, err := s.call(ctx, opAdd, key, b[:])
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("rendezvous: Add(%q): server answered %d bytes, want 8", key, len(v))
	}
	return int64(binary.BigEndian.Uint64(v)), nil
}

// Close closes the connection and, on rank 0, the server. Ranks still
// waiting on the server then fail with an error. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.conn != nil {
		s.conn.Close()
	}
	s.mu.Unlock()
	if s.server != nil {
		return s.server.Close()
	}
	return nil
}

// bound gives ctx the Store's Timeout when it has no deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.opts.Timeout)
}

// dial connects and greets, retrying while the server is not up yet and
// while it drops the connection before the greeting is done (a server
// making room for new connections closes those that have not greeted).
func (s *Store) dial(ctx context.Context) error {
	var d net.Dialer
	delay := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", s.opts.Addr)
		if err == nil {
			s.conn, s.r = c, bufio.NewReader(c)
			if err = s.greet(ctx); err == nil {
				return nil
			}
			s.conn.Close()
			s.conn = nil
			if !transient(err) {
				return fmt.Errorf("rendezvous: rank %d: the store at %s: %w", s.opts.Rank, s.opts.Addr, err)
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: rank %d: connecting to the store at %s (served by rank 0): %v", ErrTimeout, s.opts.Rank, s.opts.Addr, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// transient reports whether a greeting failed on the way (the connection
// dropped, reset or timed out) rather than by the server's answer.
func transient(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// greet opens the connection with Hello. With a secret, it proves to the
// server that this Store knows it, and checks that the server knows it
// too (server.go has the handshake).
func (s *Store) greet(ctx context.Context) error {
	deadline, _ := ctx.Deadline()
	s.conn.SetDeadline(deadline)
	defer s.conn.SetDeadline(time.Time{})
	if s.opts.Secret == "" {
		v, err := s.roundTrip(opHello, "", nil, 0)
		if err == nil && len(v) != 0 {
			err = fmt.Errorf("the greeting: the server answered %d bytes, want none: is it the job's store?", len(v))
		}
		return err
	}
	client := make([]byte, nonceSize)
	rand.Read(client)
	v, err := s.roundTrip(opHello, "", client, 0)
	if err != nil {
		return fmt.Errorf("the secret's handshake: %w", err)
	}
	if len(v) != nonceSize+sha256.Size || !hmac.Equal(v[nonceSize:], proof(s.opts.Secret, "server", client, v[:nonceSize])) {
		return fmt.Errorf("%w: the server does not know the job's secret: it is not this job's store", ErrAuth)
	}
	if _, err := s.roundTrip(opAuth, "", proof(s.opts.Secret, "client", client, v[:nonceSize]), 0); err != nil {
		return fmt.Errorf("the secret's handshake: %w", err)
	}
	return nil
}

var opNames = [...]string{opSet: "Set", opGet: "Get", opAdd: "Add", opWait: "Wait", opHello: "Hello", opAuth: "Auth"}

func opName(op byte) string {
	if int(op) < len(opNames) && opNames[op] != "" {
		return opNames[op]
	}
	return fmt.Sprintf("operation %d", op)
}

func (s *Store) call(ctx context.Context, op byte, key string, value []byte) ([]byte, error) {
	if len(key) > MaxSize || len(value) > MaxSize {
		return nil, fmt.Errorf("%w: %s(%q): key of %d bytes, value of %d bytes (at most %d each)", ErrInvalid, opNames[op], trim(key), len(key), len(value), MaxSize)
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	deadline, _ := ctx.Deadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: %s(%q)", ErrClosed, opNames[op], trim(key))
	}
	if s.conn == nil {
		// A previous call broke the connection mid-frame; start afresh.
		if err := s.dial(ctx); err != nil {
			return nil, err
		}
	}
	conn := s.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(deadline)
	v, err := s.roundTrip(op, key, value, time.Until(deadline))
	if err != nil {
		s.conn.Close()
		s.conn = nil
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() || ctx.Err() != nil {
			return nil, fmt.Errorf("%w: rank %d: %s(%q) on the store at %s: %v", ErrTimeout, s.opts.Rank, opNames[op], trim(key), s.opts.Addr, err)
		}
		return nil, fmt.Errorf("rendezvous: rank %d: %s(%q) on the store at %s: %w", s.opts.Rank, opNames[op], trim(key), s.opts.Addr, err)
	}
	return v, nil
}

func (s *Store) roundTrip(op byte, key string, value []byte, wait time.Duration) ([]byte, error) {
	b := s.scratch[:0]
	b = append(b, op)
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	b = append(b, value...)
	b = binary.BigEndian.AppendUint64(b, uint64(max(wait, 0)))
	s.scratch = b[:0]
	if _, err := s.conn.Write(b); err != nil {
		return nil, err
	}
	var hdr [5]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxSize+64 {
		return nil, fmt.Errorf("answer of %d bytes", n)
	}
	v := make([]byte, n)
	if _, err := io.ReadFull(s.r, v); err != nil {
		return nil, err
	}
	switch hdr[0] {
	case statusOK:
		return v, nil
	case statusTimeout:
		return nil, serverTimeout(string(v))
	case statusAuth:
		return nil, fmt.Errorf("%w: %s", ErrAuth, v)
	default:
		return nil, errors.New(string(v))
	}
}

const (
	statusOK byte = iota
	statusTimeout
	statusError
	statusAuth // the job's secret is missing or wrong
)

// serverTimeout is the server's report that a key did not appear in time;
// it reads as a net.Error timeout so that call maps it to ErrTimeout.
type serverTimeout string

func (e serverTimeout) Error() string { return string(e) }
func (serverTimeout) Timeout() bool   { return true }
func (serverTimeout) Temporary() bool { return false }

func trim(k string) string {
	if len(k) > 64 {
		return k[:64] + "..."
	}
	return k
}
