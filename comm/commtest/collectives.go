package commtest

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/internal/invariants"
)

// sentinel fills buffers that a collective must overwrite.
const sentinel = 0xEE

func setAll(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// counts returns the element counts to test for dt: the small sizes, and
// the large one when the group runs it. Under the race detector the large
// size is kept for float32 only.
func counts(sizes []int, large int, dt comm.DType, perRank int) []int {
	cs := append([]int(nil), sizes...)
	if large > 0 && (!invariants.RaceEnabled || dt == comm.Float32) {
		cs = append(cs, largeCount(large, dt)/perRank)
	}
	return cs
}

// inputs encodes every rank's input values in dt.
func inputs(dt comm.DType, v [][]float64) [][]byte {
	in := make([][]byte, len(v))
	for r := range in {
		in[r] = table(dt, func(j int) float64 { return v[r][j] })
	}
	return in
}

func placeName(inPlace bool) string {
	if inPlace {
		return "in place"
	}
	return "out of place"
}

func (tm *team) allReduce(t *testing.T, sizes []int, large int) {
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			tm.check(t, fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				v := values(dt, tm.n, false, 1)
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				tm.allReduceCase(dt, op, inputs(dt, v), want, counts(sizes, large, dt, 1))
			})
		}
	}
}

// halfRounding checks half-precision sums whose exact value is not
// representable: the result must be the single rounding of the exact sum.
func (tm *team) halfRounding(t *testing.T) {
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, op := range []comm.Op{comm.Sum, comm.Avg} {
			tm.check(t, fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				v := values(dt, tm.n, true, 7)
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				tm.allReduceCase(dt, op, inputs(dt, v), want, []int{1, 7, 4<<10 + 3})
			})
		}
	}
}

func (tm *team) allReduceCase(dt comm.DType, op comm.Op, in [][]byte, want []byte, counts []int) {
	sz, tol := dt.Size(), tm.cfg.tolerance(dt, op)
	for _, count := range counts {
		for _, inPlace := range []bool{true, false} {
			bytes := count * sz
			what := fmt.Sprintf("all_reduce(%s) of %s, count %s, %s", op, dt, sizeName(count, sz), placeName(inPlace))
			tm.step(what, func(r int) []comm.Work {
				b := tm.mem.get(r, slotSend, bytes)
				fill(b, in[r], sz, 0, count)
				o := b
				if !inPlace {
					o = tm.mem.get(r, slotRecv, bytes)
					setAll(o, sentinel)
				}
				return []comm.Work{tm.cs[r].AllReduce(buffer(b, dt), buffer(o, dt), op)}
			}, func(r int) string {
				b := tm.mem.get(r, slotSend, bytes)
				if inPlace {
					return check(dt, b, want, 0, count, tol)
				}
				if msg := check(dt, tm.mem.get(r, slotRecv, bytes), want, 0, count, tol); msg != "" {
					return "recv " + msg
				}
				if msg := check(dt, b, in[r], 0, count, 0); msg != "" {
					return "send buffer changed: " + msg
				}
				return ""
			})
		}
	}
}

func (tm *team) broadcast(t *testing.T, sizes []int, large int) {
	for _, dt := range comm.DTypes {
		v := values(dt, tm.n, false, 2)
		sz := dt.Size()
		for root := range tm.n {
			tm.check(t, fmt.Sprintf("%s/root%d", dt, root), func(t *testing.T) {
				in := table(dt, func(j int) float64 { return v[root][j] })
				for _, count := range counts(sizes, large, dt, 1) {
					bytes := count * sz
					what := fmt.Sprintf("broadcast from root %d of %s, count %s", root, dt, sizeName(count, sz))
					tm.step(what, func(r int) []comm.Work {
						b := tm.mem.get(r, slotSend, bytes)
						if r == root {
							fill(b, in, sz, 0, count)
						} else {
							setAll(b, sentinel)
						}
						return []comm.Work{tm.cs[r].Broadcast(buffer(b, dt), root)}
					}, func(r int) string {
						return check(dt, tm.mem.get(r, slotSend, bytes), in, 0, count, 0)
					})
				}
			})
		}
	}
}

func (tm *team) reduce(t *testing.T, sizes []int, large int) {
	n := tm.n
	for _, dt := range comm.DTypes {
		sz := dt.Size()
		for _, op := range comm.Ops {
			v := values(dt, n, false, 3)
			in := inputs(dt, v)
			want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
			tol := tm.cfg.tolerance(dt, op)
			for root := range n {
				tm.check(t, fmt.Sprintf("%s/%s/root%d", dt, op, root), func(t *testing.T) {
					cnts := sizes
					if root == n-1 || op == comm.Sum && root == 0 {
						cnts = counts(sizes, large, dt, 1)
					}
					for _, count := range cnts {
						for _, inPlace := range []bool{false, true} {
							bytes := count * sz
							what := fmt.Sprintf("reduce(%s) to root %d of %s, count %s, %s", op, root, dt, sizeName(count, sz), placeName(inPlace))
							tm.step(what, func(r int) []comm.Work {
								sb := tm.mem.get(r, slotSend, bytes)
								fill(sb, in[r], sz, 0, count)
								rb := sb
								if !inPlace {
									rb = tm.mem.get(r, slotRecv, bytes)
									setAll(rb, sentinel)
								}
								return []comm.Work{tm.cs[r].Reduce(buffer(sb, dt), buffer(rb, dt), op, root)}
							}, func(r int) string {
								sb := tm.mem.get(r, slotSend, bytes)
								if r == root {
									got, where := sb, ""
									if !inPlace {
										got, where = tm.mem.get(r, slotRecv, bytes), "recv "
									}
									if msg := check(dt, got, want, 0, count, tol); msg != "" {
										return "root's " + where + msg
									}
									if inPlace {
										return ""
									}
								}
								if msg := check(dt, sb, in[r], 0, count, 0); msg != "" {
									return "send buffer changed: " + msg
								}
								return ""
							})
						}
					}
				})
			}
		}
	}
}

func (tm *team) allGather(t *testing.T, sizes []int, large int) {
	n := tm.n
	for _, dt := range comm.DTypes {
		tm.check(t, dt.String(), func(t *testing.T) {
			sz := dt.Size()
			in := inputs(dt, values(dt, n, false, 4))
			for _, count := range counts(sizes, large, dt, n) {
				for _, inPlace := range []bool{false, true} {
					bytes := count * sz
					what := fmt.Sprintf("all_gather of %s, count %s per rank, %s", dt, sizeName(count, sz), placeName(inPlace))
					tm.step(what, func(r int) []comm.Work {
						rb := tm.mem.get(r, slotRecv, n*bytes)
						setAll(rb, sentinel)
						sb := rb[r*bytes : (r+1)*bytes]
						if !inPlace {
							sb = tm.mem.get(r, slotSend, bytes)
						}
						fill(sb, in[r], sz, 0, count)
						return []comm.Work{tm.cs[r].AllGather(buffer(sb, dt), buffer(rb, dt))}
					}, func(r int) string {
						rb := tm.mem.get(r, slotRecv, n*bytes)
						for q := range n {
							if msg := check(dt, rb[q*bytes:], in[q], 0, count, 0); msg != "" {
								return fmt.Sprintf("recv block %d (rank %d's): %s", q, q, msg)
							}
						}
						if !inPlace {
							if msg := check(dt, tm.mem.get(r, slotSend, bytes), in[r], 0, count, 0); msg != "" {
								return "send buffer changed: " + msg
							}
						}
						return ""
					})
				}
			}
		})
	}
}

func (tm *team) reduceScatter(t *testing.T, sizes []int, large int) {
	n := tm.n
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			tm.check(t, fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				sz, tol := dt.Size(), tm.cfg.tolerance(dt, op)
				v := values(dt, n, false, 5)
				in := inputs(dt, v)
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				for _, count := range counts(sizes, large, dt, n) {
					for _, inPlace := range []bool{false, true} {
						bytes := count * sz
						what := fmt.Sprintf("reduce_scatter(%s) of %s, count %s per rank, %s", op, dt, sizeName(count, sz), placeName(inPlace))
						tm.step(what, func(r int) []comm.Work {
							sb := tm.mem.get(r, slotSend, n*bytes)
							fill(sb, in[r], sz, 0, n*count)
							rb := sb[r*bytes : (r+1)*bytes]
							if !inPlace {
								rb = tm.mem.get(r, slotRecv, bytes)
								setAll(rb, sentinel)
							}
							return []comm.Work{tm.cs[r].ReduceScatter(buffer(sb, dt), buffer(rb, dt), op)}
						}, func(r int) string {
							got := tm.mem.get(r, slotSend, n*bytes)[r*bytes:]
							if !inPlace {
								got = tm.mem.get(r, slotRecv, bytes)
							}
							if msg := check(dt, got, want, r*count, count, tol); msg != "" {
								return fmt.Sprintf("block %d: %s", r, msg)
							}
							return ""
						})
					}
				}
			})
		}
	}
}

// sendRecvRing passes each rank's message to the next rank. Even ranks
// send first and odd ranks receive first, which completes on any backend
// whose Send may wait for the matching Recv.
func (tm *team) sendRecvRing(t *testing.T, sizes []int, large int) {
	n := tm.n
	for _, dt := range comm.DTypes {
		tm.check(t, dt.String(), func(t *testing.T) {
			sz := dt.Size()
			in := inputs(dt, values(dt, n, false, 6))
			for _, count := range counts(sizes, large, dt, 1) {
				bytes := count * sz
				what := fmt.Sprintf("send/recv ring of %s, count %s", dt, sizeName(count, sz))
				tm.step(what, func(r int) []comm.Work {
					sb, rb := tm.mem.get(r, slotSend, bytes), tm.mem.get(r, slotRecv, bytes)
					fill(sb, in[r], sz, 0, count)
					setAll(rb, sentinel)
					c, next, prev := tm.cs[r], (r+1)%n, (r+n-1)%n
					if r%2 == 0 {
						return []comm.Work{c.Send(buffer(sb, dt), next), c.Recv(buffer(rb, dt), prev)}
					}
					return []comm.Work{c.Recv(buffer(rb, dt), prev), c.Send(buffer(sb, dt), next)}
				}, func(r int) string {
					prev := (r + n - 1) % n
					if msg := check(dt, tm.mem.get(r, slotRecv, bytes), in[prev], 0, count, 0); msg != "" {
						return fmt.Sprintf("from rank %d: %s", prev, msg)
					}
					if msg := check(dt, tm.mem.get(r, slotSend, bytes), in[r], 0, count, 0); msg != "" {
						return "send buffer changed: " + msg
					}
					return ""
				})
			}
		})
	}
}
