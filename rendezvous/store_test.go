package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ddpgo/ddpgo/internal/testutil"
)

// open returns n Stores of one job on a free local port, closed when the
// test ends.
func open(t *testing.T, n int) []*Store {
	t.Helper()
	ctx := context.Background()
	s0, err := Open(ctx, Options{Addr: "127.0.0.1:0", Rank: 0, Size: n, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ss := []*Store{s0}
	for r := 1; r < n; r++ {
		s, err := Open(ctx, Options{Addr: s0.Addr(), Rank: r, Size: n, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	t.Cleanup(func() {
		for i := len(ss) - 1; i >= 0; i-- {
			ss[i].Close()
		}
	})
	return ss
}

// held returns a channel that receives the key of every Get or Wait that
// srv holds from now on.
func held(srv *Server) <-chan string {
	ch := make(chan string, 16)
	srv.mu.Lock()
	srv.onHold = func(key string) { ch <- key }
	srv.mu.Unlock()
	return ch
}

func TestSetGetAcrossRanks(t *testing.T) {
	testutil.NoLeak(t)
	ss := open(t, 3)
	ctx := context.Background()
	holding := held(ss[0].server)
	got := make([][]byte, len(ss))
	var wg sync.WaitGroup
	for r := 1; r < len(ss); r++ {
		wg.Go(func() {
			v, err := ss[r].Get(ctx, "id")
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
			got[r] = v
		})
	}
	for range len(ss) - 1 {
		<-holding // the Gets are held by the server
	}
	id := bytes.Repeat([]byte{0xab, 0, 7}, 43)
	if err := ss[0].Set(ctx, "id", id); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for r := 1; r < len(ss); r++ {
		if !bytes.Equal(got[r], id) {
			t.Errorf("rank %d got %x, want %x", r, got[r], id)
		}
	}
	if err := ss[2].Wait(ctx, "id"); err != nil {
		t.Fatal(err)
	}
	// An empty value is a value.
	if err := ss[1].Set(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := ss[0].Get(ctx, "empty"); err != nil || len(v) != 0 {
		t.Fatalf("Get(empty) = %q, %v", v, err)
	}
}

func TestAddIsAtomic(t *testing.T) {
	testutil.NoLeak(t)
	ss := open(t, 4)
	const per = 50
	var wg sync.WaitGroup
	seen := make([][]int64, len(ss))
	for r, s := range ss {
		wg.Go(func() {
			for range per {
				v, err := s.Add(context.Background(), "n", 1)
				if err != nil {
					t.Error(err)
					return
				}
				seen[r] = append(seen[r], v)
			}
		})
	}
	wg.Wait()
	all := map[int64]bool{}
	for _, vs := range seen {
		for _, v := range vs {
			if all[v] {
				t.Fatalf("Add returned %d twice", v)
			}
			all[v] = true
		}
	}
	if len(all) != per*len(ss) || !all[1] || !all[per*int64(len(ss))] {
		t.Fatalf("Add returned %d distinct values, want 1..%d", len(all), per*len(ss))
	}
	if v, err := ss[0].Add(context.Background(), "n", -10); err != nil || v != per*int64(len(ss))-10 {
		t.Fatalf("Add(-10) = %d, %v", v, err)
	}
	if err := ss[0].Set(context.Background(), "s", []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := ss[1].Add(context.Background(), "s", 1); err == nil {
		t.Fatal("Add on a key set by Set succeeded")
	}
}

func TestDeadlines(t *testing.T) {
	testutil.NoLeak(t)
	ss := open(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ss[1].Get(ctx, "never")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Get of a key never set: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Get with a 50ms deadline returned after %v", d)
	}
	// The Store's own Timeout bounds a call whose context has none.
	s, err := Open(context.Background(), Options{Addr: ss[0].Addr(), Rank: 3, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Wait(context.Background(), "never"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait without a deadline: %v, want ErrTimeout", err)
	}
	// The connection is usable after a timeout.
	if err := s.Set(context.Background(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := ss[0].Get(context.Background(), "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get after a timeout = %q, %v", v, err)
	}
	// A context cancelled without a deadline ends a held Get too.
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, ccancel)
	if _, err := ss[1].Get(cctx, "never"); err == nil {
		t.Fatal("Get with a cancelled context succeeded")
	}
}

func TestLateServer(t *testing.T) {
	testutil.NoLeak(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	done := make(chan error, 1)
	var s1 *Store
	go func() {
		var err error
		s1, err = Open(context.Background(), Options{Addr: addr, Rank: 1, Timeout: 10 * time.Second})
		done <- err
	}()
	// Something that is not the store holds the port first: rank 1's
	// first connection ends before its greeting is answered, and rank 1
	// keeps trying, through refused connections once the port is free.
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ln.Close()
	s0, err := Open(context.Background(), Options{Addr: addr, Rank: 0})
	if err != nil {
		t.Skipf("port %s taken meanwhile: %v", addr, err)
	}
	defer s0.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if err := s1.Set(context.Background(), "a", []byte("b")); err != nil {
		t.Fatal(err)
	}

	// Nobody serving: a bounded failure naming the address.
	_, err = Open(context.Background(), Options{Addr: addr + "9", Rank: 1, Timeout: 100 * time.Millisecond})
	if err == nil {
		t.Fatal("Open with no server succeeded")
	}
}

func TestCloseFailsHeldCalls(t *testing.T) {
	testutil.NoLeak(t)
	ss := open(t, 2)
	holding := held(ss[0].server)
	errc := make(chan error, 1)
	go func() {
		_, err := ss[1].Get(context.Background(), "never")
		errc <- err
	}()
	<-holding
	if err := ss[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := ss[0].Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Get held by a closed server succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Get held by a closed server did not return")
	}
	if err := ss[0].Set(context.Background(), "k", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Close: %v, want ErrClosed", err)
	}
}

func TestFromEnv(t *testing.T) {
	cases := []struct {
		addr, port, rank, size string
		want                   Options
		ok                     bool
	}{
		{"10.0.0.1", "29500", "1", "4", Options{Addr: "10.0.0.1:29500", Rank: 1, Size: 4}, true},
		{"", "29500", "0", "1", Options{Addr: "127.0.0.1:29500", Rank: 0, Size: 1}, true},
		{"::1", "29500", "0", "2", Options{Addr: "[::1]:29500", Rank: 0, Size: 2}, true},
		{"h", "", "0", "1", Options{}, false},
		{"h", "x", "0", "1", Options{}, false},
		{"h", "1", "", "1", Options{}, false},
		{"h", "1", "2", "2", Options{}, false},
		{"h", "1", "0", "zero", Options{}, false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s:%s/%s/%s", c.addr, c.port, c.rank, c.size), func(t *testing.T) {
			t.Setenv("MASTER_ADDR", c.addr)
			t.Setenv("MASTER_PORT", c.port)
			t.Setenv("RANK", c.rank)
			t.Setenv("WORLD_SIZE", c.size)
			o, err := FromEnv()
			if c.ok != (err == nil) || c.ok && o != c.want {
				t.Fatalf("FromEnv() = %+v, %v; want %+v, ok %v", o, err, c.want, c.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestTooLarge(t *testing.T) {
	ss := open(t, 1)
	if err := ss[0].Set(context.Background(), "k", make([]byte, MaxSize+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Set of %d bytes: %v, want ErrInvalid", MaxSize+1, err)
	}
}
