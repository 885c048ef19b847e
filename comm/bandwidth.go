package comm

import "time"

// BusBWFactor is nccl-tests' bus-bandwidth factor for a collective over n
// ranks: busbw = algbw * factor. It makes bandwidth comparable across
// ranks counts and with the hardware's peak.
func BusBWFactor(k Kind, n int) float64 {
	if n <= 0 {
		return 0
	}
	switch k {
	case KindAllReduce:
		return 2 * float64(n-1) / float64(n)
	case KindAllGather, KindReduceScatter:
		return float64(n-1) / float64(n)
	case KindBroadcast, KindReduce, KindSend, KindRecv:
		return 1
	}
	return 0
}

// AlgBW returns bytes/d in GB/s (GB = 1e9 bytes), or 0 when d is 0.
// bytes is the size nccl-tests uses: the larger of the send and receive
// buffers (the full vector for all_gather and reduce_scatter).
func AlgBW(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// BusBW returns AlgBW(bytes, d) * BusBWFactor(k, n).
func BusBW(k Kind, n int, bytes int64, d time.Duration) float64 {
	return AlgBW(bytes, d) * BusBWFactor(k, n)
}
