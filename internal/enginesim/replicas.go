package enginesim

import (
	"time"

	"github.com/inferlb/inferlb/internal/enginesim/model"
)

// replicaSet is an engine's replicas: identical model engines behind one
// address (fleet.Engine.Replicas). A new request goes to the replica with
// the fewest requests in it (ties: the lowest index), like a least-request
// service in front of vLLM pods. Guarded by Server.mu.
type replicaSet struct {
	engs []*model.Engine
}

func newReplicaSet(n int, cfg model.Config, l model.Listener) (*replicaSet, error) {
	rs := &replicaSet{}
	for range n {
		e, err := model.New(cfg, l)
		if err != nil {
			return nil, err
		}
		rs.engs = append(rs.engs, e)
	}
	return rs, nil
}

// submit adds r to the least-loaded replica and returns its index.
func (rs *replicaSet) submit(r *model.Request, now time.Duration) (int, error) {
	best, load := 0, -1
	for i, e := range rs.engs {
		e.Advance(now)
		st := e.Stats()
		if l := st.Running + st.Waiting + st.Pending; load < 0 || l < load {
			best, load = i, l
		}
	}
	return best, rs.engs[best].Submit(r, now)
}

func (rs *replicaSet) abort(r *model.Request, replica int, now time.Duration) {
	rs.engs[replica].Abort(r, now)
}

func (rs *replicaSet) advance(now time.Duration) {
	for _, e := range rs.engs {
		e.Advance(now)
	}
}

func (rs *replicaSet) nextEvent() (t time.Duration, ok bool) {
	for _, e := range rs.engs {
		if et, eok := e.NextEvent(); eok && (!ok || et < t) {
			t, ok = et, true
		}
	}
	return t, ok
}

func (rs *replicaSet) setFaults(slowdown float64, hang bool, now time.Duration) {
	for _, e := range rs.engs {
		_ = e.SetSlowdown(slowdown)
		e.SetHang(hang, now)
	}
}

// stats sums the replicas' states and counters; KVUsage is the fraction of
// all their blocks in use.
func (rs *replicaSet) stats() model.Stats {
	var s model.Stats
	used := 0.0
	for _, e := range rs.engs {
		st := e.Stats()
		s.Running += st.Running
		s.Waiting += st.Waiting
		s.Pending += st.Pending
		s.KVBlocks += st.KVBlocks
		s.CachedBlocks += st.CachedBlocks
		s.PrefixQueries += st.PrefixQueries
		s.PrefixHits += st.PrefixHits
		s.PromptTokens += st.PromptTokens
		s.GenerationTokens += st.GenerationTokens
		s.Steps += st.Steps
		used += st.KVUsage * float64(st.KVBlocks)
	}
	if s.KVBlocks > 0 {
		s.KVUsage = used / float64(s.KVBlocks)
	}
	return s
}
