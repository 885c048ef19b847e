// Package standin builds and steers the stand-in for libnccl.so.2 and
// libcuda.so.1 (nccl/testdata/standin/standin.c) used by the tests of
// package nccl and of ddpbench; it needs cgo.
package standin
