//go:build purego || !amd64

package lowrank

func reconstruct(c, e, p, q []float32, n, m, r int) { reconstructGo(c, e, p, q, n, m, r, 0) }
