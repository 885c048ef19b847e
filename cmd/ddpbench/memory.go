package main

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// availableMemory returns the bytes of memory the kernel can give a new
// allocation without swapping (Linux's MemAvailable), or false when it is
// not known. A variable so that tests can pretend.
var availableMemory = memAvailable

// memAvailable reads MemAvailable from /proc/meminfo.
func memAvailable() (int64, bool) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "MemAvailable:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil || kb < 0 {
				return 0, false
			}
			return kb << 10, true
		}
	}
	return 0, false
}

// checkMemory refuses a run that would need more memory than the machine
// has available: all ranks live in this process, so their buffers add
// up, and running out means the kernel's OOM killer, not an error.
// what says where the need comes from, naming the flags that set it.
func checkMemory(need int64, what string) error {
	avail, ok := availableMemory()
	if !ok || need <= avail {
		return nil
	}
	return usagef("%s: needs about %s of memory, more than the %s available", what, fmtBytes(need), fmtBytes(avail))
}

// runMemory estimates the memory of one run: per rank, the bucket
// buffers (the gradients), the gradients' own copies when they are not
// bucket views, the half-precision scratch of a compressing hook, and
// PowerSGD's errors (with error feedback) and scratch (the uncompressed
// tensors, Ps and Qs: a quarter of the gradients is generous).
func runMemory(gradBytes int64, ranks int, bucketView bool, compression string, errorFeedback bool) int64 {
	per := gradBytes
	if !bucketView {
		per += gradBytes
	}
	switch compression {
	case "fp16", "bf16":
		per += gradBytes / 2
	case "powersgd":
		per += gradBytes / 4
		if errorFeedback {
			per += gradBytes
		}
	}
	return per * int64(ranks)
}
