// Package envoylb is a Go model of the host selection Envoy 1.40 does for a
// cluster with the MAGLEV or RING_HASH load balancer: weighted Maglev
// (table size 65537 by default), weighted ring hash (xxHash, ketama
// lookup), consistent hashing with bounded loads (hash_balance_factor),
// priority levels with the 1.4 overprovisioning factor, and the retry host
// predicate's re-selection (previous_hosts with
// host_selection_retry_max_attempts). It is the one implementation of that
// choice: the fleet simulator uses it to predict the engine a frontend Envoy
// picks for the same EDS weights and affinity key, and ext_proc's
// endpoint-picker mode (extproc/picker) uses it to make that same pick
// itself when a gateway's Envoy routes to the endpoint it names.
// TestAgainstEnvoy checks it key by key against a real Envoy.
//
// What it follows, from Envoy's source (source/extensions/load_balancing_
// policies/{maglev,ring_hash,common/thread_aware_lb_impl}.cc, and
// source/common/http/hash_policy.cc):
//
//   - A header hash_policy hashes the header's value with XXH64, seed 0.
//   - Per priority, the weights of the healthy hosts are normalized to sum
//     1 (in panic mode, every host's).
//   - Maglev: hosts are sorted by their hash key (the address "ip:port"),
//     each gets offset XXH64(key) mod M and skip XXH64(key, seed 1) mod
//     (M−1) + 1, and the table is filled round by round where a host with
//     weight w takes a slot in round r when r·w ≥ its running target (which
//     grows by the largest weight each time it takes one). Lookup:
//     table[hash mod M]; on a host-selection retry attempt a > 0 the hash is
//     first XORed with 2⁶⁴ − a.
//   - Ring hash: scale = min(ceil(minW·minRing)/minW, maxRing) entries in
//     all; for each host in order, entries XXH64("key_i") until the running
//     count reaches the running target scale·w; sorted by hash; lookup is the
//     first entry with hash ≥ h (wrapping), and attempt a moves a entries on.
//   - Bounded loads: with factor f and O requests active in the cluster, a
//     host of normalized weight w may hold max(ceil(ceil((O+1)·f/100)·w), 1)
//     requests; an overloaded pick probes the other hosts in an order
//     shuffled by a mt19937 seeded with the hash, takes the first that is not
//     overloaded, else the least overloaded.
//
// Not modelled: locality-weighted balancing (inferlb does not enable it),
// degraded hosts, slow start.
package envoylb

import (
	"fmt"
	"math"
	"math/big"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// Policy is the cluster's load balancer.
type Policy uint8

// Load balancers.
const (
	Maglev Policy = iota
	RingHash
)

func (p Policy) String() string {
	if p == RingHash {
		return "ring_hash"
	}
	return "maglev"
}

// Config is the cluster's load-balancing configuration.
type Config struct {
	Policy Policy
	// TableSize is the Maglev table size (a prime; 0: 65537).
	TableSize uint64
	// RingMin and RingMax bound the ring's size (0: Envoy's 1024 and 8M).
	RingMin, RingMax uint64
	// HashBalanceFactor is hash_balance_factor (0: off, else ≥ 100).
	HashBalanceFactor uint32
	// PanicThreshold is healthy_panic_threshold in percent (inferlb: 0).
	PanicThreshold float64
}

// Host is one endpoint of the cluster's EDS assignment.
type Host struct {
	// Key is what Envoy hashes for the host: its address as "ip:port"
	// (use_hostname_for_hashing off).
	Key      string
	Weight   uint32
	Priority uint32
	// Healthy is Envoy's view: the EDS health status (HEALTHY and UNKNOWN
	// count as healthy) combined with active health checking and outlier
	// ejection.
	Healthy bool
}

// Load reports in-flight requests for bounded loads: Active(i) of the host
// at index i of the hosts given to New, and Total for the whole cluster.
type Load interface {
	Active(host int) int
	Total() int
}

// LB is the host selection of one cluster at one Envoy, built from one EDS
// assignment and the hosts' health (Envoy rebuilds it on every change of
// either). Safe for concurrent reads.
type LB struct {
	cfg   Config
	hosts []Host
	prios []*level
	// load[p] is priority p's share of traffic in percent (sums to 100
	// unless no host is healthy).
	load []uint32
}

// level is one priority's hashing table.
type level struct {
	idx     []int     // host indexes (into LB.hosts) of the table's hosts, in host order
	weights []float64 // normalized weight of idx[k]
	// Maglev
	table []int32 // host index per slot
	// ring
	ring []ringEntry
}

type ringEntry struct {
	hash uint64
	host int32
}

// Default sizes, as in Envoy.
const (
	DefaultTableSize = 65537
	DefaultRingMin   = 1024
	DefaultRingMax   = 8 * 1024 * 1024
	// overprovisioning is Envoy's default overprovisioning factor (1.4).
	overprovisioning = 140
)

// New builds the selection for hosts (in EDS order).
func New(cfg Config, hosts []Host) (*LB, error) {
	if cfg.TableSize == 0 {
		cfg.TableSize = DefaultTableSize
	}
	if cfg.RingMin == 0 {
		cfg.RingMin = DefaultRingMin
	}
	if cfg.RingMax == 0 {
		cfg.RingMax = DefaultRingMax
	}
	if cfg.Policy == Maglev && !isPrime(cfg.TableSize) {
		return nil, fmt.Errorf("envoylb: maglev table size %d is not a prime", cfg.TableSize)
	}
	if cfg.RingMin > cfg.RingMax {
		return nil, fmt.Errorf("envoylb: ring min size %d > max size %d", cfg.RingMin, cfg.RingMax)
	}
	if cfg.HashBalanceFactor != 0 && cfg.HashBalanceFactor < 100 {
		return nil, fmt.Errorf("envoylb: hash_balance_factor %d must be 0 or ≥ 100", cfg.HashBalanceFactor)
	}
	var maxP uint32
	for i, h := range hosts {
		if h.Weight == 0 {
			return nil, fmt.Errorf("envoylb: host %d (%s): weight 0 (Envoy rejects it)", i, h.Key)
		}
		if h.Key == "" {
			return nil, fmt.Errorf("envoylb: host %d: empty hash key", i)
		}
		maxP = max(maxP, h.Priority)
	}
	lb := &LB{cfg: cfg, hosts: hosts}
	if len(hosts) == 0 {
		return lb, nil
	}
	health := make([]uint32, maxP+1)
	for p := uint32(0); p <= maxP; p++ {
		var all, healthy []int
		for i, h := range hosts {
			if h.Priority != p {
				continue
			}
			all = append(all, i)
			if h.Healthy {
				healthy = append(healthy, i)
			}
		}
		if len(all) > 0 {
			health[p] = min(100, uint32(overprovisioning*len(healthy)/len(all)))
		}
		panic := len(all) > 0 && 100*float64(len(healthy))/float64(len(all)) < cfg.PanicThreshold
		use := healthy
		if panic {
			use = all
		}
		lv := &level{}
		lb.prios = append(lb.prios, lv)
		if len(use) == 0 {
			continue
		}
		var sum uint64
		for _, i := range use {
			sum += uint64(hosts[i].Weight)
		}
		minW, maxW := 1.0, 0.0
		for _, i := range use {
			w := float64(hosts[i].Weight) / float64(sum)
			lv.idx = append(lv.idx, i)
			lv.weights = append(lv.weights, w)
			minW, maxW = math.Min(minW, w), math.Max(maxW, w)
		}
		if cfg.Policy == Maglev {
			lv.buildMaglev(hosts, cfg.TableSize, maxW)
		} else {
			lv.buildRing(hosts, cfg.RingMin, cfg.RingMax, minW)
		}
	}
	lb.load = priorityLoad(health)
	return lb, nil
}

// priorityLoad spreads 100% over the priorities by health, higher
// priorities (lower numbers) first, normalized when the total health is
// below 100 (Envoy's LoadBalancerBase::recalculatePerPriorityState).
func priorityLoad(health []uint32) []uint32 {
	load := make([]uint32, len(health))
	total := uint32(0)
	for _, h := range health {
		total += h
	}
	if total == 0 {
		return load
	}
	total = min(total, 100)
	left := uint32(100)
	for p, h := range health {
		// Each priority's normalized health, as a share of the total.
		l := min(h*100/total, left)
		load[p] = l
		left -= l
	}
	// Rounding leftover goes to the first priority with load.
	if left > 0 {
		for p := range load {
			if load[p] > 0 {
				load[p] += left
				break
			}
		}
	}
	return load
}

// Hosts returns the hosts the LB was built from.
func (lb *LB) Hosts() []Host { return lb.hosts }

// PriorityLoad returns the share of traffic, in percent, of each priority.
func (lb *LB) PriorityLoad() []uint32 { return lb.load }

// HeaderHash is the hash Envoy's header hash_policy computes for a value.
func HeaderHash(v string) uint64 { return xxhash.Sum64String(v) }

// Choose returns the index (into the hosts given to New) of the host Envoy
// picks for hash h, or -1 when no host is available. load feeds bounded
// loads (may be nil when the factor is 0). reject, if not nil, is the retry
// host predicate (previous_hosts: the hosts this request already tried);
// selectAttempts is host_selection_retry_max_attempts (the predicate gets
// that many re-selections, each with a mutated hash).
func (lb *LB) Choose(h uint64, load Load, reject func(host int) bool, selectAttempts int) int {
	if len(lb.prios) == 0 {
		return -1
	}
	p := lb.choosePriority(h)
	if p < 0 {
		return -1
	}
	lv := lb.prios[p]
	if len(lv.idx) == 0 {
		return -1
	}
	attempts := 1
	if reject != nil {
		attempts = selectAttempts + 1
	}
	host := -1
	for a := 0; a < attempts; a++ {
		host = lb.pick(lv, h, uint32(a), load)
		if host < 0 || reject == nil || !reject(host) {
			return host
		}
	}
	return host
}

// Successors returns up to n distinct hosts (indexes into the hosts given
// to New) in the order they follow hash h on the table of the priority
// Choose uses for h, then on the other priorities' tables in priority order:
// for Maglev the slots from h mod M onwards, for ring hash the entries from
// h's onwards. Hosts for which skip returns true are left out (skip may be
// nil). These are the hosts Envoy's table puts nearest the key: the
// endpoint picker's fallbacks, and its pick when the one Choose made is not
// allowed.
func (lb *LB) Successors(h uint64, n int, skip func(host int) bool) []int {
	if n <= 0 || len(lb.prios) == 0 {
		return nil
	}
	var out []int
	seen := map[int]bool{}
	take := func(host int) bool {
		if seen[host] || (skip != nil && skip(host)) {
			return false
		}
		seen[host] = true
		out = append(out, host)
		return len(out) >= n
	}
	first := lb.choosePriority(h)
	order := []int{first}
	for p := range lb.prios {
		if p != first {
			order = append(order, p)
		}
	}
	for _, p := range order {
		lv := lb.prios[p]
		if len(lv.idx) == 0 {
			continue
		}
		if lb.cfg.Policy == Maglev {
			// Every host of the level is met after a few times its
			// count of slots; the walk stops then, not after M slots.
			m, met := uint64(len(lv.table)), map[int32]bool{}
			for i, s := uint64(0), h%m; i < m && len(met) < len(lv.idx); i, s = i+1, (s+1)%m {
				host := lv.table[s]
				met[host] = true
				if take(int(host)) {
					return out
				}
			}
			continue
		}
		r := lv.ring
		start := lv.ringIndex(h)
		for i := 0; i < len(r); i++ {
			if take(int(r[(start+i)%len(r)].host)) {
				return out
			}
		}
	}
	return out
}

// choosePriority is LoadBalancerBase::choosePriority: hash mod 100 against
// the cumulative priority loads.
func (lb *LB) choosePriority(h uint64) int {
	v := uint32(h % 100)
	acc := uint32(0)
	for p, l := range lb.load {
		acc += l
		if v < acc {
			return p
		}
	}
	// No priority has load (nothing healthy): Envoy falls to priority 0,
	// whose table is empty unless in panic.
	return 0
}

func (lb *LB) pick(lv *level, h uint64, attempt uint32, load Load) int {
	var host int
	if lb.cfg.Policy == Maglev {
		hh := h
		if attempt > 0 {
			hh ^= ^uint64(0) - uint64(attempt) + 1
		}
		host = int(lv.table[hh%uint64(len(lv.table))])
	} else {
		host = lv.ringLookup(h, attempt)
	}
	if lb.cfg.HashBalanceFactor == 0 || load == nil {
		return host
	}
	return lb.bounded(lv, h, host, load)
}

// overload is hostOverloadFactor: the host's active requests over the most
// a host of normalized weight w may hold.
func (lb *LB) overload(host int, w float64, load Load) float64 {
	total := (uint64(load.Total()+1)*uint64(lb.cfg.HashBalanceFactor) + 99) / 100
	slots := max(uint64(math.Ceil(float64(total)*w)), 1)
	return float64(load.Active(host)) / float64(slots)
}

func (lb *LB) bounded(lv *level, h uint64, host int, load Load) int {
	k0 := lv.pos(host)
	of := lb.overload(host, lv.weights[k0], load)
	if of <= 1 {
		return host
	}
	n := len(lv.idx)
	order := make([]uint32, n)
	for i := range order {
		order[i] = uint32(i)
	}
	var mt mt19937
	mt.seed(uint32(h))
	best, bestOF := host, of
	for i := 0; i < n; i++ {
		j := mt.uniform(uint32(n - i))
		order[i], order[i+int(j)] = order[i+int(j)], order[i]
		k := int(order[i])
		alt := lv.idx[k]
		if alt == host {
			continue
		}
		o := lb.overload(alt, lv.weights[k], load)
		if o <= 1 {
			return alt
		}
		if bestOF > o {
			best, bestOF = alt, o
		}
	}
	return best
}

// pos is the position of host in lv.idx.
func (lv *level) pos(host int) int {
	k := sort.SearchInts(lv.idx, host)
	if k < len(lv.idx) && lv.idx[k] == host {
		return k
	}
	panic("envoylb: host not in its level")
}

func (lv *level) buildMaglev(hosts []Host, m uint64, maxW float64) {
	type entry struct {
		key          string
		host         int
		offset, skip uint64
		next         uint64
		weight       float64
		target       float64
	}
	es := make([]entry, len(lv.idx))
	for k, i := range lv.idx {
		key := hosts[i].Key
		d := xxhash.NewWithSeed(1)
		_, _ = d.WriteString(key)
		es[k] = entry{key: key, host: i, offset: xxhash.Sum64String(key) % m, skip: d.Sum64()%(m-1) + 1, weight: lv.weights[k]}
	}
	sort.Slice(es, func(a, b int) bool { return es[a].key < es[b].key })
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	filled := uint64(0)
	for it := 1; filled < m; it++ {
		for k := 0; k < len(es) && filled < m; k++ {
			e := &es[k]
			if float64(it)*e.weight < e.target {
				continue
			}
			e.target += maxW
			c := (e.offset + e.skip*e.next) % m
			for table[c] >= 0 {
				e.next++
				c = (e.offset + e.skip*e.next) % m
			}
			table[c] = int32(e.host)
			e.next++
			filled++
		}
	}
	lv.table = table
}

func (lv *level) buildRing(hosts []Host, minRing, maxRing uint64, minW float64) {
	scale := math.Min(math.Ceil(minW*float64(minRing))/minW, float64(maxRing))
	lv.ring = make([]ringEntry, 0, uint64(math.Ceil(scale)))
	cur, target := 0.0, 0.0
	buf := make([]byte, 0, 64)
	for k, i := range lv.idx {
		target += scale * lv.weights[k]
		for n := 0; cur < target; n++ {
			buf = append(buf[:0], hosts[i].Key...)
			buf = append(buf, '_')
			buf = appendUint(buf, uint64(n))
			lv.ring = append(lv.ring, ringEntry{hash: xxhash.Sum64(buf), host: int32(i)})
			cur++
		}
	}
	sort.SliceStable(lv.ring, func(a, b int) bool { return lv.ring[a].hash < lv.ring[b].hash })
}

// ringLookup is ketama's search: the entry whose hash is the first ≥ h
// (strictly above the previous entry's), wrapping to the first.
func (lv *level) ringLookup(h uint64, attempt uint32) int {
	mid := int64(lv.ringIndex(h))
	if attempt > 0 {
		mid = (mid + int64(attempt)) % int64(len(lv.ring))
	}
	return int(lv.ring[mid].host)
}

// ringIndex is the position of h's entry on the ring.
func (lv *level) ringIndex(h uint64) int {
	r := lv.ring
	lo, hi := int64(0), int64(len(r))
	mid := int64(0)
	for {
		mid = (lo + hi) / 2
		if mid == int64(len(r)) {
			mid = 0
			break
		}
		mv := r[mid].hash
		var mv1 uint64
		if mid > 0 {
			mv1 = r[mid-1].hash
		}
		if h <= mv && h > mv1 {
			break
		}
		if mv < h {
			lo = mid + 1
		} else {
			hi = mid - 1
		}
		if lo > hi {
			mid = 0
			break
		}
	}
	return int(mid)
}

func appendUint(b []byte, v uint64) []byte {
	var d [20]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, d[i:]...)
}

// isPrime is exact: ProbablyPrime(0) (Baillie-PSW) makes no mistakes
// below 2^64.
func isPrime(n uint64) bool { return new(big.Int).SetUint64(n).ProbablyPrime(0) }

// mt19937 is the 32-bit Mersenne Twister (std::mt19937), which Envoy seeds
// with the request's hash to order the probes of bounded loads.
type mt19937 struct {
	s [624]uint32
	i int
}

func (m *mt19937) seed(v uint32) {
	m.s[0] = v
	for i := 1; i < 624; i++ {
		m.s[i] = 1812433253*(m.s[i-1]^(m.s[i-1]>>30)) + uint32(i)
	}
	m.i = 624
}

func (m *mt19937) next() uint32 {
	if m.i >= 624 {
		for k := 0; k < 624; k++ {
			y := m.s[k]&0x80000000 | m.s[(k+1)%624]&0x7fffffff
			v := m.s[(k+397)%624] ^ (y >> 1)
			if y&1 != 0 {
				v ^= 0x9908b0df
			}
			m.s[k] = v
		}
		m.i = 0
	}
	y := m.s[m.i]
	m.i++
	y ^= y >> 11
	y ^= (y << 7) & 0x9d2c5680
	y ^= (y << 15) & 0xefc60000
	y ^= y >> 18
	return y
}

// uniform is Envoy's uniform_int: a value in [0, k) by rejection.
func (m *mt19937) uniform(k uint32) uint32 {
	x := k
	for x >= k {
		x = uint32(uint64(m.next()) / ((uint64(math.MaxUint32) + 1) / uint64(k)))
	}
	return x
}
