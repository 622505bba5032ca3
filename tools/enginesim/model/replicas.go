package model

import "time"

// Replicas are an engine's replicas: identical Engines behind one address
// (fleet.Engine.Replicas). A new request goes to the replica with the
// fewest requests in it (ties: the lowest index), like a least-request
// service in front of vLLM pods. The engine simulator's HTTP shell and the
// fleet simulator both drive one per served engine. Not safe for concurrent
// use.
type Replicas struct {
	engs []*Engine
}

// NewReplicas returns n idle replicas of cfg reporting to l.
func NewReplicas(n int, cfg Config, l Listener) (*Replicas, error) {
	rs := &Replicas{}
	for range n {
		e, err := New(cfg, l)
		if err != nil {
			return nil, err
		}
		rs.engs = append(rs.engs, e)
	}
	return rs, nil
}

// Submit adds r to the least-loaded replica and returns its index.
func (rs *Replicas) Submit(r *Request, now time.Duration) (int, error) {
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

// Abort aborts r on the replica that holds it.
func (rs *Replicas) Abort(r *Request, replica int, now time.Duration) {
	rs.engs[replica].Abort(r, now)
}

// Advance advances every replica to now.
func (rs *Replicas) Advance(now time.Duration) {
	for _, e := range rs.engs {
		e.Advance(now)
	}
}

// NextEvent is the earliest next event of the replicas.
func (rs *Replicas) NextEvent() (t time.Duration, ok bool) {
	for _, e := range rs.engs {
		if et, eok := e.NextEvent(); eok && (!ok || et < t) {
			t, ok = et, true
		}
	}
	return t, ok
}

// SetFaults applies a slowdown factor and hangs (or resumes) every
// replica at now.
func (rs *Replicas) SetFaults(slowdown float64, hang bool, now time.Duration) {
	for _, e := range rs.engs {
		_ = e.SetSlowdown(slowdown)
		e.SetHang(hang, now)
	}
}

// Stats sums the replicas' states and counters; KVUsage is the fraction of
// all their blocks in use.
func (rs *Replicas) Stats() Stats {
	var s Stats
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

// CachedBlocks is the longest cached prefix, in blocks, among the replicas
// (see Engine.CachedBlocks).
func (rs *Replicas) CachedBlocks(hashes []uint64) int {
	best := 0
	for _, e := range rs.engs {
		best = max(best, e.CachedBlocks(hashes))
	}
	return best
}

// Backlog sums the replicas' backlogs (see Engine.Backlog).
func (rs *Replicas) Backlog() Backlog {
	var b Backlog
	for _, e := range rs.engs {
		eb := e.Backlog()
		b.WaitingTokens += eb.WaitingTokens
		b.UncachedTokens += eb.UncachedTokens
	}
	return b
}

// Len is the number of replicas.
func (rs *Replicas) Len() int { return len(rs.engs) }
