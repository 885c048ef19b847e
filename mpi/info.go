//go:build mpi && cgo

package mpi

/*
#cgo pkg-config: ompi-c
#include "ddpmpi.h"
*/
import "C"

import (
	"fmt"
)

// LibraryInfo reports the MPI library and, once initialised, the thread
// level MPI provided.
func LibraryInfo() Info {
	var buf [C.MPI_MAX_LIBRARY_VERSION_STRING + 1]C.char
	C.ddp_library_version(&buf[0], C.int(len(buf)))
	lib := C.GoString(&buf[0])
	for i, r := range lib {
		if r == '\n' {
			lib = lib[:i]
			break
		}
	}
	info := Info{Built: true, Library: lib, Requested: threadLevel(C.MPI_THREAD_SERIALIZED), F16C: C.ddp_has_f16c() != 0}
	rtMu.Lock()
	defer rtMu.Unlock()
	if e := rt; e != nil {
		info.Initialized, info.OwnInit = true, e.ours
		info.Provided = threadLevel(e.provided)
		info.WorldRank, info.WorldSize = e.worldRank, e.worldSize
		info.MallocTuned, info.TCPTuned, info.TCPFlags, info.TCPEagerLimit = e.mallocTuned, e.tcpTuned, e.tcpFlags, e.tcpEager
		info.Hosts, info.LargeAllReduce = e.lastHosts, e.lastLarge
		info.SharedMemory, info.SharedMemoryFailure = e.lastShared, e.shmFailure
		info.Hierarchy, info.HierarchyChunk = e.lastHier, e.lastChunk
		if e.lastShared {
			info.SharedMemoryMin = directMin
		}
	}
	return info
}

func threadLevel(l int) string {
	switch l {
	case C.MPI_THREAD_SINGLE:
		return "MPI_THREAD_SINGLE"
	case C.MPI_THREAD_FUNNELED:
		return "MPI_THREAD_FUNNELED"
	case C.MPI_THREAD_SERIALIZED:
		return "MPI_THREAD_SERIALIZED"
	case C.MPI_THREAD_MULTIPLE:
		return "MPI_THREAD_MULTIPLE"
	}
	return fmt.Sprintf("thread level %d", l)
}

// Error is an error MPI returned: its code, its class and its own text.
type Error struct {
	Code, Class int
	Msg         string
}

func (e *Error) Error() string {
	return fmt.Sprintf("MPI error %d (class %d): %s", e.Code, e.Class, e.Msg)
}

func mpiError(code int) error {
	var buf [C.MPI_MAX_ERROR_STRING + 1]C.char
	var class C.int
	C.ddp_error_string(C.int(code), &buf[0], C.int(len(buf)), &class)
	return &Error{Code: code, Class: int(class), Msg: C.GoString(&buf[0])}
}
