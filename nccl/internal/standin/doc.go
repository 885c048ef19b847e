// Package standin builds and steers the stand-in for libnccl.so.2 and
// libcuda.so.1 used by package nccl's tests; it needs cgo.
package standin
