package envoylb

import (
	"fmt"
	"math"
	"testing"
)

// hostsOf builds hosts with the given weights at distinct addresses.
func hostsOf(ws ...uint32) []Host {
	hs := make([]Host, len(ws))
	for i, w := range ws {
		hs[i] = Host{Key: fmt.Sprintf("10.0.0.%d:8000", i+1), Weight: w, Healthy: true}
	}
	return hs
}

// shares counts where n keys go.
func shares(t *testing.T, lb *LB, n int) []float64 {
	t.Helper()
	out := make([]float64, len(lb.Hosts()))
	for i := 0; i < n; i++ {
		h := lb.Choose(HeaderHash(fmt.Sprintf("key-%d", i)), nil, nil, 0)
		if h < 0 {
			t.Fatalf("no host for key %d", i)
		}
		out[h] += 1 / float64(n)
	}
	return out
}

// Both tables give each host its weight's share of keys.
func TestWeightedShares(t *testing.T) {
	ws := []uint32{100, 200, 300, 400}
	for _, pol := range []Policy{Maglev, RingHash} {
		lb, err := New(Config{Policy: pol}, hostsOf(ws...))
		if err != nil {
			t.Fatal(err)
		}
		got := shares(t, lb, 40000)
		for i, w := range ws {
			want := float64(w) / 1000
			// Maglev's table is exact to a slot; the ring with 1024 entries
			// for the lightest host is within a few percent.
			tol := 0.015
			if pol == RingHash {
				tol = 0.05
			}
			if math.Abs(got[i]-want) > tol {
				t.Errorf("%s: host %d share %.3f, want %.3f ± %.3f", pol, i, got[i], want, tol)
			}
		}
	}
}

// Changing one weight moves few keys, and only keys touching that host
// (the remap factor docs/architecture.md quotes: about 1.3–1.4× the
// total-variation distance for Maglev).
func TestMaglevRemap(t *testing.T) {
	a, _ := New(Config{}, hostsOf(250, 250, 250, 250))
	b, _ := New(Config{}, hostsOf(300, 250, 250, 200))
	moved := 0
	const n = 20000
	for i := 0; i < n; i++ {
		h := HeaderHash(fmt.Sprintf("key-%d", i))
		if a.Choose(h, nil, nil, 0) != b.Choose(h, nil, nil, 0) {
			moved++
		}
	}
	tv := 0.05
	f := float64(moved) / n / tv
	if f < 1 || f > 2 {
		t.Errorf("moved %.3f of keys for a TV distance of %.2f (factor %.2f), want a factor in [1, 2]", float64(moved)/n, tv, f)
	}
}

// An unhealthy host's keys go elsewhere; a priority-1 host gets traffic only
// when priority 0 is too unhealthy; with nothing healthy there is no host
// (panic threshold 0).
func TestHealthAndPriorities(t *testing.T) {
	hs := hostsOf(1, 1, 1, 1, 1)
	hs[4].Priority = 1
	lb, _ := New(Config{}, hs)
	if got := shares(t, lb, 2000)[4]; got != 0 {
		t.Errorf("priority-1 host got %.3f with priority 0 healthy", got)
	}
	hs[0].Healthy = false
	lb, _ = New(Config{}, hs)
	// 3 of 4 healthy × 1.4 ≥ 100%: priority 0 still takes everything.
	if s := shares(t, lb, 2000); s[0] != 0 || s[4] != 0 {
		t.Errorf("unhealthy host or priority 1 got traffic: %v", s)
	}
	hs[1].Healthy, hs[2].Healthy = false, false
	lb, _ = New(Config{}, hs)
	// 1 of 4 healthy: priority 0 health 35%, priority 1 100% → loads 35/65... normalized.
	if l := lb.PriorityLoad(); l[0] != 35 || l[1] != 65 {
		t.Errorf("priority load %v, want [35 65]", l)
	}
	for i := range hs {
		hs[i].Healthy = false
	}
	lb, _ = New(Config{}, hs)
	if h := lb.Choose(1234, nil, nil, 0); h != -1 {
		t.Errorf("nothing healthy, got host %d", h)
	}
}

type loadMap struct {
	active []int
	total  int
}

func (l *loadMap) Active(i int) int { return l.active[i] }
func (l *loadMap) Total() int       { return l.total }

// With hash_balance_factor 150, one hot key spreads once its host holds
// more than its bounded share; without it, everything stays on one host.
func TestBoundedLoad(t *testing.T) {
	for _, pol := range []Policy{Maglev, RingHash} {
		hs := hostsOf(1, 1, 1, 1)
		lb, _ := New(Config{Policy: pol, HashBalanceFactor: 150}, hs)
		l := &loadMap{active: make([]int, 4)}
		h := HeaderHash("hot")
		for i := 0; i < 40; i++ {
			c := lb.Choose(h, l, nil, 0)
			l.active[c]++
			l.total++
		}
		used := 0
		for i, a := range l.active {
			// Cap at the end: ceil(ceil(40·1.5)·0.25) = 15, +1 accepted at
			// equality.
			if a > 16 {
				t.Errorf("%s: host %d holds %d of 40 (active %v)", pol, i, a, l.active)
			}
			if a > 0 {
				used++
			}
		}
		if used < 3 {
			t.Errorf("%s: the hot key used %d hosts (active %v)", pol, used, l.active)
		}
		off, _ := New(Config{Policy: pol}, hs)
		first := off.Choose(h, l, nil, 0)
		for i := 0; i < 10; i++ {
			if off.Choose(h, l, nil, 0) != first {
				t.Fatalf("%s without bounded loads: a key moved", pol)
			}
		}
	}
}

// A retry with previous_hosts picks a different host, unless all six
// mutated hashes land on the tried one (Envoy then sends it there anyway).
func TestRetryReselect(t *testing.T) {
	lb, _ := New(Config{}, hostsOf(1, 1, 1))
	same := 0
	const n = 2000
	for i := 0; i < n; i++ {
		h := HeaderHash(fmt.Sprintf("k%d", i))
		first := lb.Choose(h, nil, nil, 0)
		if lb.Choose(h, nil, func(x int) bool { return x == first }, 5) == first {
			same++
		}
	}
	if f := float64(same) / n; f > 0.03 {
		t.Errorf("%.3f of retries went back to the failed host", f)
	}
}

// The Mersenne Twister matches std::mt19937's reference output (the
// 10000th value for the default seed 5489 is 4123659995, per the C++
// standard).
func TestMT19937(t *testing.T) {
	var m mt19937
	m.seed(5489)
	var v uint32
	for i := 0; i < 10000; i++ {
		v = m.next()
	}
	if v != 4123659995 {
		t.Fatalf("mt19937 10000th = %d, want 4123659995", v)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg   Config
		hosts []Host
	}{
		{Config{TableSize: 65536}, hostsOf(1)},
		{Config{Policy: RingHash, RingMin: 10, RingMax: 5}, hostsOf(1)},
		{Config{HashBalanceFactor: 50}, hostsOf(1)},
		{Config{}, hostsOf(0)},
	} {
		if _, err := New(c.cfg, c.hosts); err == nil {
			t.Errorf("New(%+v) accepted", c.cfg)
		}
	}
}

func BenchmarkMaglevBuild(b *testing.B) {
	ws := make([]uint32, 100)
	for i := range ws {
		ws[i] = uint32(1 + i%7)
	}
	hs := hostsOf(ws...)
	for b.Loop() {
		if _, err := New(Config{}, hs); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSuccessors: the walk starts at the host Choose picks (no load), lists
// each allowed host once, and goes on to the failover priority.
func TestSuccessors(t *testing.T) {
	hosts := []Host{
		{Key: "10.0.0.1:80", Weight: 5, Healthy: true}, {Key: "10.0.0.2:80", Weight: 3, Healthy: true},
		{Key: "10.0.0.3:80", Weight: 1, Healthy: true}, {Key: "10.0.0.4:80", Weight: 1, Priority: 1, Healthy: true},
	}
	for _, pol := range []Policy{Maglev, RingHash} {
		lb, err := New(Config{Policy: pol, TableSize: 307}, hosts)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 200; k++ {
			h := HeaderHash(fmt.Sprint("key-", k))
			all := lb.Successors(h, 10, nil)
			if len(all) != len(hosts) {
				t.Fatalf("%v key %d: successors %v, want every host once", pol, k, all)
			}
			if c := lb.Choose(h, nil, nil, 0); all[0] != c {
				t.Fatalf("%v key %d: walk starts at %d, Choose picks %d", pol, k, all[0], c)
			}
			if all[3] != 3 {
				t.Fatalf("%v key %d: the priority-1 host comes last, got %v", pol, k, all)
			}
			skip := lb.Successors(h, 2, func(i int) bool { return i == all[0] })
			if len(skip) != 2 || skip[0] != all[1] || skip[1] != all[2] {
				t.Fatalf("%v key %d: skipping the first gives %v, want %v", pol, k, skip, all[1:3])
			}
		}
	}
}
