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
type requestTable struct {
	prefix string // random per process: a previous process's ids never match
	next   atomic.Uint64
	maxAge time.Duration

	// mu guards byID and lastSweep.
	mu        sync.Mutex
	byID      map[string]*tracked
	lastSweep time.Time
}

// tracked is one admitted request: its decision and when it began.
type tracked struct {
	dc    Decision // its retry charges are guarded by the table's mu
	start time.Time
}

func newRequestTable(maxAge time.Duration, now time.Time) *requestTable {
	if maxAge <= 0 {
		maxAge = DefaultMaxRequestAge
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return &requestTable{prefix: hex.EncodeToString(b) + "-", maxAge: maxAge, byID: map[string]*tracked{}, lastSweep: now}
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
// process's, already expired, or forged).
func (t *requestTable) take(id string) *tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.byID[id]
	delete(t.byID, id)
	return r
}

// useRetry records a failed attempt of the request with the id: if it had
// a retry left, Envoy retries, and the retry is charged to its class's
// budget (Decider.ChargeRetry).
func (t *requestTable) useRetry(d *Decider, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.byID[id]; r != nil {
		d.ChargeRetry(&r.dc)
	}
}
