package picker

import (
	"sync"

	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/internal/envoylb"
)

// classTable is one class's host selection (extproc.BuildTables).
type classTable = extproc.ClassTable

// tableSet is every class's table for one policy.
type tableSet struct {
	policy  *extproc.Policy
	classes map[string]*classTable
	err     error
}

// tableCache holds the tables of the policy in force (rebuilt when the
// policy changes: Maglev tables are built once per policy, not per
// request) and the picker's in-flight count per class and endpoint, the
// load that bounded loads weigh. The counts outlive policies: they are by
// address.
type tableCache struct {
	mu    sync.Mutex
	cur   *tableSet
	loads map[string]map[string]int // class → address → requests in flight
	total map[string]int
}

// get returns the tables for pol, building them on its first use.
func (tc *tableCache) get(pol *extproc.Policy) *tableSet {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.cur != nil && tc.cur.policy == pol {
		return tc.cur
	}
	cls, err := extproc.BuildTables(pol)
	tc.cur = &tableSet{policy: pol, classes: cls, err: err}
	return tc.cur
}

// classLoad is a class's in-flight counts seen as envoylb.Load.
type classLoad struct {
	t      *classTable
	counts map[string]int
	total  int
}

func (l classLoad) Active(host int) int { return l.counts[l.t.Hosts[host].Key] }
func (l classLoad) Total() int          { return l.total }

// pick chooses the request's endpoints: the primary Envoy's table gives
// for its affinity key under this frontend's load, then up to Fallbacks
// distinct healthy hosts that follow the key on the table. With a subset
// hint only the subset's hosts count; when the primary is not among them
// the first that follows the key is. No endpoint: the reason
// ("no_ready_endpoint" or "subset_unavailable").
func (p *Picker) pick(r *request) ([]string, string) {
	ts := p.tables.get(r.dc.Policy)
	if ts.err != nil {
		p.log.Error("endpoint picker: the policy's endpoints do not build a table", "policy", r.dc.Policy.Version, "err", ts.err)
		return nil, "no_ready_endpoint"
	}
	t := ts.classes[r.class]
	if t == nil || len(t.Hosts) == 0 {
		return nil, "no_ready_endpoint"
	}
	var allowed map[int]bool
	if r.hinted {
		allowed = map[int]bool{}
		for _, a := range r.subset {
			if i, ok := t.Index[a]; ok {
				allowed[i] = true
			}
		}
	}
	skip := func(i int) bool { return !t.Hosts[i].Healthy || (allowed != nil && !allowed[i]) }
	h := envoylb.HeaderHash(r.dc.AffinityHeader())

	tc := &p.tables
	tc.mu.Lock()
	defer tc.mu.Unlock()
	counts := tc.loads[r.class]
	if counts == nil {
		counts = map[string]int{}
		tc.loads[r.class] = counts
	}
	primary := t.LB.Choose(h, classLoad{t: t, counts: counts, total: tc.total[r.class]}, nil, 0)
	if primary < 0 || skip(primary) {
		next := t.LB.Successors(h, 1, skip)
		if len(next) == 0 {
			if r.hinted {
				return nil, "subset_unavailable"
			}
			return nil, "no_ready_endpoint"
		}
		primary = next[0]
	}
	eps := []string{t.Hosts[primary].Key}
	if n := p.opt.Fallbacks; n > 0 {
		for _, i := range t.LB.Successors(h, n, func(i int) bool { return i == primary || skip(i) }) {
			eps = append(eps, t.Hosts[i].Key)
		}
	}
	counts[eps[0]]++
	tc.total[r.class]++
	r.counted = eps[0]
	return eps, ""
}

// move moves one request's count from one endpoint to another (a
// fallback served it).
func (tc *tableCache) move(class, from, to string) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	c := tc.loads[class]
	if c == nil {
		return
	}
	if from != "" && c[from] > 0 {
		c[from]--
		if c[from] == 0 {
			delete(c, from)
		}
		tc.total[class]--
	}
	c[to]++
	tc.total[class]++
}

// done ends one request's count.
func (tc *tableCache) done(class, addr string) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	c := tc.loads[class]
	if c == nil || c[addr] == 0 {
		return
	}
	c[addr]--
	if c[addr] == 0 {
		delete(c, addr)
	}
	tc.total[class]--
}
