package extproc

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferlb/inferlb/extproc/body"
)

// Failed-attempt entries are evidence only for ids this process admitted,
// at most 1 + the request's retries times, and for endedGrace after its
// end (its late entries); forged, replayed and stale ones count nothing
// and are counted as unknown. Without the table check the forged entries
// below are 20 errors at a1.
func TestFailedAttemptsNeedAnAdmittedID(t *testing.T) {
	h := newHonestRig(t)
	errorsAt := func() (responses, errs uint64) {
		for _, e := range h.s.Observer().Flush(h.now).Engines {
			responses += e.Responses
			errs += e.Errors
		}
		return responses, errs
	}
	a1 := h.addrs[0]
	for i := 0; i < 20; i++ {
		h.s.attemptFailed(logEntry("forged-"+string(rune('a'+i)), a1, 503, nil, 0, 0))
	}
	h.s.attemptFailed(logEntry("", a1, 503, nil, 0, 0))
	if r, e := errorsAt(); r != 0 || e != 0 {
		t.Errorf("forged failures counted: %d responses, %d errors", r, e)
	}
	if n := testutil.ToFloat64(h.s.m.unknownLogs.WithLabelValues("upstream")); n != 21 {
		t.Errorf("unknown upstream entries = %v, want 21", n)
	}

	st := &stream{start: h.now, kind: body.Chat}
	h.s.onRequestBody(st, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if st.id == "" {
		t.Fatal("request not admitted")
	}
	attempts := 1 + st.dc.Retries
	// The request ends first (the request log flushes sooner), then its
	// failures arrive; one more than it could make is refused, and so is
	// a replay of its end.
	h.s.requestEnded(logEntry(st.id, a1, 200, nil, 10*time.Millisecond, 20*time.Millisecond), h.s.Policy())
	for i := 0; i < attempts+3; i++ {
		h.s.attemptFailed(logEntry(st.id, a1, 503, nil, 0, 0))
	}
	h.s.requestEnded(logEntry(st.id, a1, 200, nil, 10*time.Millisecond, 20*time.Millisecond), h.s.Policy())
	if r, e := errorsAt(); r != uint64(1+attempts) || e != uint64(attempts) {
		t.Errorf("one request with %d attempts: %d responses, %d errors, want %d and %d", attempts, r, e, 1+attempts, attempts)
	}
	// Past the grace, its id is stale.
	st2 := &stream{start: h.now, kind: body.Chat}
	h.s.onRequestBody(st2, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	h.s.requestEnded(logEntry(st2.id, a1, 200, nil, 10*time.Millisecond, 20*time.Millisecond), h.s.Policy())
	h.now = h.now.Add(endedGrace + time.Second)
	h.s.attemptFailed(logEntry(st2.id, a1, 503, nil, 0, 0))
	if _, e := errorsAt(); e != 0 {
		t.Errorf("a failure %v after its request ended counted", endedGrace+time.Second)
	}
}
