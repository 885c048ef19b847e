package hier

import (
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
)

// Place is where one rank runs: the index of its host and its rank among
// that host's ranks (the launcher's local rank).
type Place struct {
	Host, Local int
}

// Layout lists every rank's Place, indexed by global rank. Hosts are
// numbered 0, 1, ... with no gaps, and the ranks of host h have the local
// ranks 0 to L_h-1, each once; L_h may differ between hosts. The global
// numbering is free: host-major (rank = the ranks of the hosts before it
// plus its local rank), round robin or any other.
type Layout []Place

// PerHost returns the layout of hosts ranks per host, numbered host-major.
func PerHost(hosts ...int) Layout {
	var l Layout
	for h, n := range hosts {
		for j := range n {
			l = append(l, Place{Host: h, Local: j})
		}
	}
	return l
}

// FromHosts returns the layout of a job whose rank r runs on the host
// named hosts[r] (a host name, or any key equal for the ranks of one host
// and different between hosts): hosts are numbered in the order their
// first rank appears, and a host's ranks get local ranks in global rank
// order. A backend gathers its ranks' host names and splits its world by
// the result: Local by host index (key: local rank), Cross by local rank
// (key: host index).
func FromHosts(hosts []string) Layout {
	index := make(map[string]int)
	count := make([]int, 0)
	l := make(Layout, len(hosts))
	for r, name := range hosts {
		h, ok := index[name]
		if !ok {
			h = len(count)
			index[name] = h
			count = append(count, 0)
		}
		l[r] = Place{Host: h, Local: count[h]}
		count[h]++
	}
	return l
}

// Validate reports whether l is a layout: at least one rank, hosts
// numbered without gaps, and on each host the local ranks 0 to L_h-1 once
// each. Its error wraps comm.ErrInvalid and names the rank at fault.
func (l Layout) Validate() error {
	_, err := newTopo(l)
	return err
}

// topo is what the algorithms need of a layout, computed once.
type topo struct {
	places []Place
	hosts  int   // H
	size   []int // L_h, by host
	shards int   // S: the smallest L_h
	first  []int // first[h]: the number of ranks on hosts before h
	// global[first[h]+j]: the global rank of local rank j of host h
	global []int
	// hostMajor: every rank's global rank is first[host]+local, so each
	// host's ranks are one range of the global numbering, in local order
	hostMajor bool
	// even: every host has the same number of ranks, S
	even bool
}

func newTopo(l Layout) (*topo, error) {
	if len(l) == 0 {
		return nil, fmt.Errorf("%w: hier: an empty layout", comm.ErrInvalid)
	}
	hosts := 0
	for r, p := range l {
		if p.Host < 0 || p.Host >= len(l) || p.Local < 0 || p.Local >= len(l) {
			return nil, fmt.Errorf("%w: hier: rank %d of %d has host %d, local rank %d", comm.ErrInvalid, r, len(l), p.Host, p.Local)
		}
		hosts = max(hosts, p.Host+1)
	}
	t := &topo{places: l, hosts: hosts, size: make([]int, hosts), first: make([]int, hosts), global: make([]int, len(l)), hostMajor: true}
	for _, p := range l {
		t.size[p.Host]++
	}
	t.shards = len(l)
	for h, n := range t.size {
		if n == 0 {
			return nil, fmt.Errorf("%w: hier: host %d of %d has no rank", comm.ErrInvalid, h, hosts)
		}
		t.shards = min(t.shards, n)
		if h > 0 {
			t.first[h] = t.first[h-1] + t.size[h-1]
		}
	}
	t.even = t.shards*hosts == len(l)
	seen := make([]int, len(l))
	for i := range seen {
		seen[i] = -1
	}
	for r, p := range l {
		if p.Local >= t.size[p.Host] {
			return nil, fmt.Errorf("%w: hier: rank %d has local rank %d on host %d, which has %d ranks", comm.ErrInvalid, r, p.Local, p.Host, t.size[p.Host])
		}
		i := t.first[p.Host] + p.Local
		if seen[i] >= 0 {
			return nil, fmt.Errorf("%w: hier: ranks %d and %d are both local rank %d of host %d", comm.ErrInvalid, seen[i], r, p.Local, p.Host)
		}
		seen[i] = r
		t.global[i] = r
		t.hostMajor = t.hostMajor && i == r
	}
	return t, nil
}

// crossSize returns the size of the cross group of local rank j: the
// number of hosts with more than j ranks.
func (t *topo) crossSize(j int) int {
	n := 0
	for _, s := range t.size {
		if s > j {
			n++
		}
	}
	return n
}

// crossRank returns the rank of host h's local rank j in its cross group:
// the number of hosts before h with more than j ranks.
func (t *topo) crossRank(h, j int) int {
	n := 0
	for _, s := range t.size[:h] {
		if s > j {
			n++
		}
	}
	return n
}

// shard returns where shard j of a buffer of n elements starts and how
// many elements it has. The S = t.shards shards are q = n/S elements
// each, the last one also the n - S·q elements left over; they depend on
// n and S alone, so every host cuts a buffer at the same places.
func (t *topo) shard(n, j int) (off, count int) {
	q := n / t.shards
	if j == t.shards-1 {
		return j * q, n - j*q
	}
	return j * q, q
}
