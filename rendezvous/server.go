package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Server serves the store to the ranks' Stores. Open starts one on rank
// 0; Serve starts one on its own (for a launcher that runs it apart from
// the ranks). It owns one goroutine per connection and one accepting;
// Close stops them all.
type Server struct {
	ln net.Listener

	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every change
	conns   map[net.Conn]struct{}
	closing chan struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves
// the store until Close.
func Serve(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: serving the store on %s: %w", addr, err)
	}
	s := &Server{ln: ln, data: map[string][]byte{}, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, closing: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
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

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
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
	for {
		op, key, value, wait, err := readRequest(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				out = answer(out[:0], statusError, []byte("rendezvous: bad request: "+err.Error()))
				c.Write(out)
			}
			return
		}
		status, v := s.do(op, key, value, wait)
		out = answer(out[:0], status, v)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
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

func readBlock(r *bufio.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	l := binary.BigEndian.Uint32(n[:])
	if l > MaxSize {
		return nil, fmt.Errorf("block of %d bytes (at most %d)", l, MaxSize)
	}
	b := make([]byte, l)
	_, err := io.ReadFull(r, b)
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
		s.data[key] = value
		s.notify()
		s.mu.Unlock()
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
		cur += int64(binary.BigEndian.Uint64(value))
		nv := binary.BigEndian.AppendUint64(nil, uint64(cur))
		s.data[key] = nv
		s.notify()
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

// notify wakes every held Get and Wait. The caller holds s.mu.
func (s *Server) notify() {
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
