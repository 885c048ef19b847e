package commtest

import (
	"fmt"
	"testing"

	"github.com/ddpgo/ddpgo/comm"
)

// sentinel fills buffers that a collective must overwrite.
const sentinel = 0xEE

// scratch holds one reusable byte buffer per rank (and purpose), so the
// large checks do not allocate anew for every case.
type scratch [][]byte

func newScratch(n, bytes int) scratch {
	s := make(scratch, n)
	for r := range s {
		s[r] = alloc(bytes)
	}
	return s
}

func (s scratch) get(r, bytes int) []byte { return s[r][:bytes] }

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
	if large > 0 && (!raceEnabled || dt == comm.Float32) {
		cs = append(cs, largeCount(large, dt)/perRank)
	}
	return cs
}

func maxBytes(sizes []int, large int) int {
	m := large
	for _, s := range sizes {
		m = max(m, s*8)
	}
	return m
}

func (s *suite) allReduce(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	buf, out := newScratch(n, maxBytes(sizes, large)), newScratch(n, maxBytes(sizes, large))
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				v := values(dt, n, false, 1)
				in := make([][]byte, n)
				for r := range in {
					in[r] = table(dt, func(j int) float64 { return v[r][j] })
				}
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				s.allReduceCase(t, cs, dt, op, in, want, counts(sizes, large, dt, 1), buf, out)
			})
		}
	}
}

func (s *suite) allReduceCase(t *testing.T, cs []comm.Communicator, dt comm.DType, op comm.Op, in [][]byte, want []byte, counts []int, buf, out scratch) {
	n, sz := len(cs), dt.Size()
	ws := make([]comm.Work, n)
	for _, count := range counts {
		for _, inPlace := range []bool{true, false} {
			for r, c := range cs {
				b := buf.get(r, count*sz)
				fill(b, in[r], sz, 0, count)
				o := b
				if !inPlace {
					o = out.get(r, count*sz)
					setAll(o, sentinel)
				}
				ws[r] = c.AllReduce(buffer(b, dt), buffer(o, dt), op)
			}
			s.waitOK(t, ws)
			for r := range cs {
				got := buf.get(r, count*sz)
				if !inPlace {
					got = out.get(r, count*sz)
				}
				if msg := check(dt, got, want, 0, count, s.cfg.tolerance(dt, op)); msg != "" {
					t.Fatalf("count %s, in place %v: rank %d: %s", sizeName(count, sz), inPlace, r, msg)
				}
				if !inPlace {
					if msg := check(dt, buf.get(r, count*sz), in[r], 0, count, 0); msg != "" {
						t.Fatalf("count %s, out of place: rank %d's send buffer changed: %s", sizeName(count, sz), r, msg)
					}
				}
			}
		}
	}
}

// halfRounding checks half-precision sums whose exact value is not
// representable: the result must be the single rounding of the exact sum.
func (s *suite) halfRounding(t *testing.T, cs []comm.Communicator) {
	n := len(cs)
	buf, out := newScratch(n, 2*(4<<10+3)), newScratch(n, 2*(4<<10+3))
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, op := range []comm.Op{comm.Sum, comm.Avg} {
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				v := values(dt, n, true, 7)
				in := make([][]byte, n)
				for r := range in {
					in[r] = table(dt, func(j int) float64 { return v[r][j] })
				}
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				s.allReduceCase(t, cs, dt, op, in, want, []int{1, 7, 4<<10 + 3}, buf, out)
			})
		}
	}
}

func (s *suite) broadcast(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	buf := newScratch(n, maxBytes(sizes, large))
	ws := make([]comm.Work, n)
	for _, dt := range comm.DTypes {
		v := values(dt, n, false, 2)
		for root := range n {
			t.Run(fmt.Sprintf("%s/root%d", dt, root), func(t *testing.T) {
				sz := dt.Size()
				in := table(dt, func(j int) float64 { return v[root][j] })
				for _, count := range counts(sizes, large, dt, 1) {
					for r, c := range cs {
						b := buf.get(r, count*sz)
						if r == root {
							fill(b, in, sz, 0, count)
						} else {
							setAll(b, sentinel)
						}
						ws[r] = c.Broadcast(buffer(b, dt), root)
					}
					s.waitOK(t, ws)
					for r := range cs {
						if msg := check(dt, buf.get(r, count*sz), in, 0, count, 0); msg != "" {
							t.Fatalf("count %s: rank %d: %s", sizeName(count, sz), r, msg)
						}
					}
				}
			})
		}
	}
}

func (s *suite) reduce(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	mb := maxBytes(sizes, large)
	send, recv := newScratch(n, mb), newScratch(n, mb)
	ws := make([]comm.Work, n)
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			v := values(dt, n, false, 3)
			in := make([][]byte, n)
			for r := range in {
				in[r] = table(dt, func(j int) float64 { return v[r][j] })
			}
			want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
			for root := range n {
				t.Run(fmt.Sprintf("%s/%s/root%d", dt, op, root), func(t *testing.T) {
					sz := dt.Size()
					cnts := sizes
					if root == n-1 || op == comm.Sum && root == 0 {
						cnts = counts(sizes, large, dt, 1)
					}
					for _, count := range cnts {
						for _, inPlace := range []bool{false, true} {
							for r, c := range cs {
								sb := send.get(r, count*sz)
								fill(sb, in[r], sz, 0, count)
								rb := recv.get(r, count*sz)
								setAll(rb, sentinel)
								if inPlace {
									rb = sb
								}
								ws[r] = c.Reduce(buffer(sb, dt), buffer(rb, dt), op, root)
							}
							s.waitOK(t, ws)
							for r := range cs {
								got := send.get(r, count*sz)
								if r == root {
									if !inPlace {
										got = recv.get(r, count*sz)
									}
									if msg := check(dt, got, want, 0, count, s.cfg.tolerance(dt, op)); msg != "" {
										t.Fatalf("count %s, in place %v: root %d: %s", sizeName(count, sz), inPlace, r, msg)
									}
									continue
								}
								if msg := check(dt, got, in[r], 0, count, 0); msg != "" {
									t.Fatalf("count %s, in place %v: rank %d's send buffer changed: %s", sizeName(count, sz), inPlace, r, msg)
								}
							}
							if !inPlace {
								if msg := check(dt, send.get(root, count*sz), in[root], 0, count, 0); msg != "" {
									t.Fatalf("count %s: root %d's send buffer changed: %s", sizeName(count, sz), root, msg)
								}
							}
						}
					}
				})
			}
		}
	}
}

func (s *suite) allGather(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	send, recv := newScratch(n, maxBytes(sizes, large)), newScratch(n, n*maxBytes(sizes, large/n))
	ws := make([]comm.Work, n)
	for _, dt := range comm.DTypes {
		t.Run(dt.String(), func(t *testing.T) {
			sz := dt.Size()
			v := values(dt, n, false, 4)
			in := make([][]byte, n)
			for r := range in {
				in[r] = table(dt, func(j int) float64 { return v[r][j] })
			}
			for _, count := range counts(sizes, large, dt, n) {
				for _, inPlace := range []bool{false, true} {
					for r, c := range cs {
						rb := recv.get(r, n*count*sz)
						setAll(rb, sentinel)
						sb := send.get(r, count*sz)
						if inPlace {
							sb = rb[r*count*sz : (r+1)*count*sz]
						}
						fill(sb, in[r], sz, 0, count)
						ws[r] = c.AllGather(buffer(sb, dt), buffer(rb, dt))
					}
					s.waitOK(t, ws)
					for r := range cs {
						rb := recv.get(r, n*count*sz)
						for q := range n {
							if msg := check(dt, rb[q*count*sz:], in[q], 0, count, 0); msg != "" {
								t.Fatalf("count %s, in place %v: rank %d, block %d: %s", sizeName(count, sz), inPlace, r, q, msg)
							}
						}
					}
				}
			}
		})
	}
}

func (s *suite) reduceScatter(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	send, recv := newScratch(n, n*maxBytes(sizes, large/n)), newScratch(n, maxBytes(sizes, large))
	ws := make([]comm.Work, n)
	for _, dt := range comm.DTypes {
		for _, op := range comm.Ops {
			t.Run(fmt.Sprintf("%s/%s", dt, op), func(t *testing.T) {
				sz := dt.Size()
				v := values(dt, n, false, 5)
				in := make([][]byte, n)
				for r := range in {
					in[r] = table(dt, func(j int) float64 { return v[r][j] })
				}
				want := table(dt, func(j int) float64 { return combine(dt, op, v, j) })
				for _, count := range counts(sizes, large, dt, n) {
					for _, inPlace := range []bool{false, true} {
						for r, c := range cs {
							sb := send.get(r, n*count*sz)
							fill(sb, in[r], sz, 0, n*count)
							rb := recv.get(r, count*sz)
							setAll(rb, sentinel)
							if inPlace {
								rb = sb[r*count*sz : (r+1)*count*sz]
							}
							ws[r] = c.ReduceScatter(buffer(sb, dt), buffer(rb, dt), op)
						}
						s.waitOK(t, ws)
						for r := range cs {
							got := recv.get(r, count*sz)
							if inPlace {
								got = send.get(r, n*count*sz)[r*count*sz:]
							}
							if msg := check(dt, got, want, r*count, count, s.cfg.tolerance(dt, op)); msg != "" {
								t.Fatalf("count %s, in place %v: rank %d: %s", sizeName(count, sz), inPlace, r, msg)
							}
						}
					}
				}
			})
		}
	}
}

// sendRecvRing passes each rank's message to the next rank. Even ranks
// send first and odd ranks receive first, which completes on any backend
// whose Send may wait for the matching Recv.
func (s *suite) sendRecvRing(t *testing.T, cs []comm.Communicator, sizes []int, large int) {
	n := len(cs)
	send, recv := newScratch(n, maxBytes(sizes, large)), newScratch(n, maxBytes(sizes, large))
	ws := make([]comm.Work, 2*n)
	for _, dt := range comm.DTypes {
		t.Run(dt.String(), func(t *testing.T) {
			sz := dt.Size()
			v := values(dt, n, false, 6)
			in := make([][]byte, n)
			for r := range in {
				in[r] = table(dt, func(j int) float64 { return v[r][j] })
			}
			for _, count := range counts(sizes, large, dt, 1) {
				for r, c := range cs {
					sb, rb := send.get(r, count*sz), recv.get(r, count*sz)
					fill(sb, in[r], sz, 0, count)
					setAll(rb, sentinel)
					next, prev := (r+1)%n, (r+n-1)%n
					if r%2 == 0 {
						ws[2*r] = c.Send(buffer(sb, dt), next)
						ws[2*r+1] = c.Recv(buffer(rb, dt), prev)
					} else {
						ws[2*r] = c.Recv(buffer(rb, dt), prev)
						ws[2*r+1] = c.Send(buffer(sb, dt), next)
					}
				}
				s.waitOK(t, ws)
				for r := range cs {
					prev := (r + n - 1) % n
					if msg := check(dt, recv.get(r, count*sz), in[prev], 0, count, 0); msg != "" {
						t.Fatalf("count %s: rank %d from rank %d: %s", sizeName(count, sz), r, prev, msg)
					}
				}
			}
		})
	}
}
