//go:build invariants

package allocator

import (
	"math"
	"strings"
	"testing"
)

func TestPoisonAfterPut(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib})
	b := mustGet(t, p, 4*kib)
	f := b.Float32s()
	for i := range f {
		f[i] = 1
	}
	mustPut(t, p, b)
	for i, v := range f {
		if !math.IsNaN(float64(v)) {
			t.Fatalf("after Put, float %d reads %v, want the NaN poison", i, v)
		}
	}
}

func TestWriteAfterPutDetected(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib})
	b := mustGet(t, p, 4*kib)
	f := b.Float32s()
	mustPut(t, p, b)
	f[100] = 3 // a write through a view kept past Put
	func() {
		defer func() {
			r := recover()
			if msg, _ := r.(string); !strings.Contains(msg, "written after Put") {
				t.Errorf("Get over memory written after Put: panic %v", r)
			}
		}()
		p.Get(4 * kib)
	}()
	// The block went back before the panic, poisoned again.
	if st := p.Stats(); st.Blocks != 0 || st.InUse != 0 {
		t.Errorf("after the detected Get: %+v", st)
	}
	if !math.IsNaN(float64(f[100])) {
		t.Errorf("the damaged word was not poisoned again: %v", f[100])
	}
}

func TestViewOfPutBlockPanics(t *testing.T) {
	p, _ := newPool(t, Options{SlabSize: 64 * kib})
	b := mustGet(t, p, 1)
	mustPut(t, p, b)
	defer func() {
		if r := recover(); r == nil {
			t.Errorf("Bytes of a block already Put: no panic")
		}
	}()
	b.Bytes()
}
