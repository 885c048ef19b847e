package allocator

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/ddpgo/ddpgo/internal/invariants"
)

// countingSource is host memory that counts calls, so tests can assert that
// steady state maps nothing. With device set it claims to be device memory
// (still host memory underneath, so a bug that touched it would not crash).
type countingSource struct {
	allocs, frees int
	live          int
	device        bool
	fail          error // returned by Alloc when set
	misalign      bool  // Alloc returns an address off Alignment
}

func (s *countingSource) Alloc(size int) (Region, error) {
	if s.fail != nil {
		return Region{}, s.fail
	}
	r, err := HostSource().Alloc(size + Alignment)
	if err != nil {
		return r, err
	}
	s.allocs++
	s.live++
	if s.misalign {
		return Region{Addr: unsafe.Add(r.Addr, 8), Size: size}, nil
	}
	return Region{Addr: r.Addr, Size: size}, nil
}

func (s *countingSource) Free(r Region) error {
	s.frees++
	s.live--
	base := unsafe.Pointer(uintptr(r.Addr) &^ (Alignment - 1))
	return HostSource().Free(Region{Addr: base, Size: r.Size + Alignment})
}

func (s *countingSource) Name() string {
	if s.device {
		return "fake-device"
	}
	return "counting-host"
}

func (s *countingSource) Host() bool { return !s.device }

func newPool(t testing.TB, o Options) (*Pool, *countingSource) {
	t.Helper()
	src := &countingSource{}
	if o.Source == nil {
		o.Source = src
	} else if cs, ok := o.Source.(*countingSource); ok {
		src = cs
	}
	p, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	t.Cleanup(func() {
		p.Close()
		if src.live != 0 && !t.Failed() {
			t.Errorf("after Close: %d regions still mapped (%d allocs, %d frees)", src.live, src.allocs, src.frees)
		}
	})
	return p, src
}

func mustGet(t testing.TB, p *Pool, n int) Block {
	t.Helper()
	b, err := p.Get(n)
	if err != nil {
		t.Fatalf("Get(%d): %v", n, err)
	}
	return b
}

func mustPut(t testing.TB, p *Pool, b Block) {
	t.Helper()
	if err := p.Put(b); err != nil {
		t.Fatalf("Put(size %d): %v", b.Size(), err)
	}
}

// wantMisuse runs f, which must report misuse: an error matching every
// target, or, under the invariants build tag, a panic with such an error.
// The message must contain every word of want.
func wantMisuse(t *testing.T, name string, f func() error, want string, targets ...error) {
	t.Helper()
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				if !invariants.Enabled {
					panic(r)
				}
				e, ok := r.(error)
				if !ok {
					e = fmt.Errorf("%v", r)
				}
				err = e
			}
		}()
		err = f()
		if invariants.Enabled && err != nil && errors.Is(err, ErrMisuse) {
			t.Errorf("%s: misuse returned %v instead of panicking under invariants", name, err)
		}
	}()
	if err == nil {
		t.Fatalf("%s: no error", name)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("%s: error %q is not %v", name, err, target)
		}
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %q does not contain %q", name, err, want)
	}
}

func overlaps(a, b Block) bool {
	if a.Size() == 0 || b.Size() == 0 {
		return false
	}
	x, y := uintptr(a.Addr()), uintptr(b.Addr())
	return x < y+uintptr(b.Size()) && y < x+uintptr(a.Size())
}
