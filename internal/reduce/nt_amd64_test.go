//go:build !purego

package reduce

import "testing"

// TestNTHead checks how many leading elements the streaming kernels store
// ordinarily, and that outputs at different offsets within a 32-byte block
// are not streamed at all.
func TestNTHead(t *testing.T) {
	x, y := alignedF32(64, 0), alignedF32(64, 0)
	tests := []struct {
		o0, o1, head int
		ok           bool
	}{
		{0, 0, 0, true}, {1, 1, 7, true}, {7, 7, 1, true}, {8, 8, 0, true}, {9, 1, 7, true},
		{0, 1, 0, false}, {3, 4, 0, false},
	}
	for _, tt := range tests {
		head, ok := ntHead(x[tt.o0:], y[tt.o1:])
		if head != tt.head || ok != tt.ok {
			t.Errorf("ntHead at offsets %d, %d = %d, %v; want %d, %v", tt.o0, tt.o1, head, ok, tt.head, tt.ok)
		}
	}
}
