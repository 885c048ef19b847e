//go:build !cgo

package nccl

import (
	"errors"
	"testing"
)

func TestNoCgo(t *testing.T) {
	if _, err := Open(Libraries{}); !errors.Is(err, ErrNoCgo) {
		t.Fatalf("Open without cgo: %v, want ErrNoCgo", err)
	}
	if info := GetInfo(Libraries{}); !errors.Is(info.Err, ErrNoCgo) {
		t.Fatalf("GetInfo without cgo: %+v", info)
	}
}
