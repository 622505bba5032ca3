package extproc

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxRequestAge is how long an admitted request may go without its
// access-log entry before its in-flight slot is taken back (see
// requestTable).
const DefaultMaxRequestAge = time.Hour

// requestTable holds the requests this instance admitted until Envoy's
// request access log says they ended.
//
// ext_proc ends its gRPC stream as soon as the decision is sent, so that a
// stream whose routing decision is made no longer depends on this process
// (were ext_proc in the response path, its death would cut every stream in
// flight in fail-closed mode). What a stream's end would tell — the
// request finished: release its in-flight slot, refund the retries it did
// not use, record which engine served and how long it took — comes from the
// access-log entry Envoy writes when the request ends, matched by the id
// ext_proc put in the request's x-inferlb-request-id header.
//
// An entry whose log never arrives (the log stream broke, Envoy restarted)
// is dropped after maxAge so that the in-flight count cannot leak.
//
// The table is also what makes the upstream log's failures evidence: a
// failed attempt counts against an engine only when its id is one this
// process issued, and at most as many times as the request could make
// attempts (1 + its retries). Whoever reaches the access-log service
// without having been given the ids (a forger) moves nothing. The two logs travel on separate streams, flushed
// at different intervals, so a request's failed attempts may arrive after
// its end: an ended request stays in done for endedGrace to match them.
type requestTable struct {
	prefix string // random per process: a previous process's ids never match
	next   atomic.Uint64
	maxAge time.Duration

	// mu guards the fields below.
	mu        sync.Mutex
	byID      map[string]*tracked
	lastSweep time.Time
	// done holds ended requests for endedGrace (late failure entries);
	// lastDoneSweep is when it was last swept.
	done          map[string]*tracked
	lastDoneSweep time.Time
}

// endedGrace is how long an ended request's id still matches failed
// attempts from the upstream log (flushed every 0.2 s; a busy Envoy may be
// late by seconds).
const endedGrace = 15 * time.Second

// tracked is one admitted request: what it holds until its end (the
// decision's Held part) and when it began.
type tracked struct {
	dc    Held // its retry charges are guarded by the table's mu
	start time.Time
	// failures counts its failed attempts counted as evidence; ended is
	// when its request-log entry came (zero before).
	failures int
	ended    time.Time
}

func newRequestTable(maxAge time.Duration, now time.Time) *requestTable {
	if maxAge <= 0 {
		maxAge = DefaultMaxRequestAge
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return &requestTable{prefix: hex.EncodeToString(b) + "-", maxAge: maxAge, byID: map[string]*tracked{}, lastSweep: now,
		done: map[string]*tracked{}, lastDoneSweep: now}
}

// add registers r and returns its id. Requests older than maxAge are
// swept (and returned for release) at most every maxAge/16.
func (t *requestTable) add(r *tracked, now time.Time) (id string, expired []*tracked) {
	id = t.prefix + strconv.FormatUint(t.next.Add(1), 36)
	t.mu.Lock()
	t.byID[id] = r
	if now.Sub(t.lastSweep) > t.maxAge/16 {
		t.lastSweep = now
		for k, x := range t.byID {
			if now.Sub(x.start) > t.maxAge {
				delete(t.byID, k)
				expired = append(expired, x)
			}
		}
	}
	t.mu.Unlock()
	return id, expired
}

// take removes and returns the request with the id (nil if unknown: another
// process's, already expired, ended, or forged). The request's id keeps
// matching its late failed attempts for endedGrace (failure).
func (t *requestTable) take(id string, now time.Time) *tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byID[id]
	if r == nil {
		return nil
	}
	delete(t.byID, id)
	r.ended = now
	t.done[id] = r
	if now.Sub(t.lastDoneSweep) > endedGrace/4 {
		t.lastDoneSweep = now
		for k, x := range t.done {
			if now.Sub(x.ended) > endedGrace {
				delete(t.done, k)
			}
		}
	}
	return r
}

// failure records a failed attempt of the request with the id. It reports
// whether the attempt is evidence: the id is one this process admitted (in
// flight, or ended less than endedGrace ago) and it has not already failed
// as many times as it could make attempts (1 + its retries; not once per
// engine: with every other engine excluded, Envoy's previous_hosts retries
// on the same one). retry says the failure made Envoy retry (it
// came before response headers): if the request had a retry left, it is
// charged to its class's budget (Decider.ChargeRetry).
func (t *requestTable) failure(d *Decider, id string, retry bool, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byID[id]
	if r == nil {
		if r = t.done[id]; r == nil || now.Sub(r.ended) > endedGrace {
			return false
		}
	}
	if r.failures > r.dc.Retries {
		return false
	}
	r.failures++
	if retry && r.ended.IsZero() {
		d.ChargeRetry(&r.dc)
	}
	return true
}
