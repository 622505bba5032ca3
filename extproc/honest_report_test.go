package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/extproc/cpclient"
)

// honestFleet has two classes of one model with small contexts (2k and 8k
// tokens), so generated prompts and max_tokens cross them.
const honestFleet = `name: honest
regions: [{name: east}]
network: {same_region_rtt_ms: 1}
frontends: [{name: fe, region: east, node_id: fe, max_requests_per_s: 1000}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: A, model: m, max_context_tokens: 2048, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 90000, max_running: 4}
  - {gpu: B, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 90000, max_running: 4}
classes:
  - {name: short, model: m, mean_prompt_tokens: 200, mean_output_tokens: 100}
  - {name: long, model: m, min_context_tokens: 4096, mean_prompt_tokens: 2000, mean_output_tokens: 100}
priorities: [{name: high, level: 0, shed_cost: 10000}, {name: low, level: 1, shed_cost: 100}]
engines:
  - {id: a1, address: "10.0.0.1:8000", region: east, gpu: A, model: m}
  - {id: a2, address: "10.0.0.2:8000", region: east, gpu: A, model: m}
  - {id: b1, address: "10.0.0.3:8000", region: east, gpu: B, model: m}
`

// honestRig is one ext_proc Server under the control plane's policy for
// the honest fleet, and the control plane's intake with the bounds the
// control plane derives for that fleet.
type honestRig struct {
	s      *Server
	intake *signals.Intake
	now    time.Time
	addrs  []string
}

func newHonestRig(t testing.TB) *honestRig {
	t.Helper()
	spec, err := fleet.Parse([]byte(honestFleet))
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := controlplane.NewController(spec, controlplane.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &honestRig{now: time.Unix(1_800_000_000, 0)}
	var ids []string
	for _, e := range spec.Engines {
		ids = append(ids, e.ID)
		h.addrs = append(h.addrs, e.Address)
	}
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, ids)
	for _, id := range ids {
		tr.Observe(signals.Sample{ID: id, At: h.now.Add(-time.Second), Healthy: true})
		tr.Observe(signals.Sample{ID: id, At: h.now, Healthy: true})
	}
	res, err := ctrl.Step(context.Background(), controlplane.Inputs{Now: h.now, Engines: tr.Engines(h.now)})
	if err != nil {
		t.Fatal(err)
	}
	o := ctrl.IntakeOptions()
	o.Window, o.Now = 10*time.Second, func() time.Time { return h.now }
	if h.intake, err = signals.NewIntake(o); err != nil {
		t.Fatal(err)
	}
	h.s = New(Options{Now: func() time.Time { return h.now }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	// A small sketch, so that points are evicted and carry error bounds.
	h.s.Observer().SetPrefixSketchSize(8)
	if err := h.s.SetPolicy(res.Nodes["fe"].Resources.Policy); err != nil {
		t.Fatal(err)
	}
	h.s.Observer().Flush(h.now)
	return h
}

// logEntry is an Envoy access-log entry for request id: the attempt's (or
// the request's last attempt's) upstream, status and response flags.
func logEntry(id, upstream string, code uint32, flags *accesslogdatav3.ResponseFlags, header, total time.Duration) *accesslogdatav3.HTTPAccessLogEntry {
	cp := &accesslogdatav3.AccessLogCommon{ResponseFlags: flags,
		TimeToFirstUpstreamTxByte: durationpb.New(time.Millisecond),
		TimeToFirstUpstreamRxByte: durationpb.New(time.Millisecond + header),
		TimeToLastUpstreamRxByte:  durationpb.New(time.Millisecond + total)}
	if upstream != "" {
		host, port, _ := net.SplitHostPort(upstream)
		p, _ := strconv.Atoi(port)
		cp.UpstreamRemoteAddress = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}}
	}
	e := &accesslogdatav3.HTTPAccessLogEntry{CommonProperties: cp,
		Request: &accesslogdatav3.HTTPRequestProperties{RequestHeaders: map[string]string{headers.RequestID: id}}}
	if code != 0 {
		e.Response = &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code)}
	}
	return e
}

// envoyEvent is one access-log entry Envoy will send: an upstream-log
// entry (a failed attempt) or the request-log entry (the request's end).
type envoyEvent struct {
	request bool
	e       *accesslogdatav3.HTTPAccessLogEntry
}

// bytesIn reads a fuzz input as a stream of choices (0 once exhausted).
type bytesIn struct {
	b []byte
	i int
}

func (r *bytesIn) next() int {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return int(r.b[r.i-1])
}

func (r *bytesIn) done() bool { return r.i >= len(r.b) }

// honestBody builds a chat body from the input: shared system prompts and
// preambles (so prefixes repeat across requests), message lengths that may
// end exactly on a chain depth, and max_tokens from absent to absurd.
func honestBody(in *bytesIn) []byte {
	shared := []string{strings.Repeat("You are a careful assistant. ", 17) + "Answer.", strings.Repeat("tool spec ", 100), "hi"}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	n := 1 + in.next()%5
	for i := 0; i < n; i++ {
		role := []string{"system", "user", "assistant", "user"}[in.next()%4]
		var text string
		switch k := in.next(); k % 4 {
		case 0, 1:
			text = shared[k%len(shared)]
		case 2:
			// A length that makes the message end at a power-of-two depth
			// (the canonical stream adds the role, 0x00, 0x1f and 0x1e).
			d := body.FirstPointBytes << (in.next() % 3)
			text = strings.Repeat("x", max(1, d-len(role)-3-(in.next()%2)*len(shared[2])))
		default:
			text = strings.Repeat(fmt.Sprintf("w%d ", in.next()), 1+in.next()*in.next()%3000)
		}
		msgs = append(msgs, msg{role, text})
	}
	req := map[string]any{"model": "m", "messages": msgs}
	switch in.next() % 5 {
	case 1:
		req["max_tokens"] = 50
	case 2:
		req["max_tokens"] = 1_000_000_000
	case 3:
		req["max_completion_tokens"] = 7000
	}
	b, _ := json.Marshal(req)
	return b
}

// runHonest plays an honest ext_proc against Envoy's behaviour, driven by
// the input: requests decided by the real Server, each followed by what
// Envoy does (attempts within the request's retry allowance that succeed,
// fail with a 5xx, reset before or after the response headers, or find no
// healthy host; the upstream log entry of every failed attempt and the
// request log entry at the end, delivered late and in any order), and the
// reporter's flushes (some sends failing, merged into the next as
// cpclient.Reporter does). Every report must be accepted by the control
// plane's intake.
func runHonest(t testing.TB, data []byte) {
	h := newHonestRig(t)
	in := &bytesIn{b: data}
	var pending []envoyEvent
	owners := map[string]int{} // request id → undelivered events
	lastFlush := h.now
	var unsent *policyv1.ReportRequest
	// Attempts that reached an engine, failed ones, and what the accepted
	// reports say: every attempt is evidence exactly once.
	var attempts, failures, responses, errs uint64
	deliver := func(i int) {
		ev := pending[i]
		pending = append(pending[:i], pending[i+1:]...)
		p := h.s.Policy()
		id := ev.e.GetRequest().GetRequestHeaders()[headers.RequestID]
		if owners[id]--; owners[id] == 0 {
			delete(owners, id)
		}
		if ev.request {
			h.s.requestEnded(ev.e, p)
		} else {
			h.s.attemptFailed(ev.e)
		}
	}
	flush := func(fail bool) {
		if h.now.Sub(lastFlush) < 100*time.Millisecond {
			h.now = lastFlush.Add(100 * time.Millisecond) // the reporter's ticker
		}
		rep := h.s.Observer().Flush(h.now)
		rep.NodeId, rep.Instance = "fe", "i"
		lastFlush = h.now
		if unsent != nil {
			rep = cpclient.Merge(unsent, rep)
			unsent = nil
		}
		if fail && h.now.Sub(rep.IntervalStart.AsTime()) < 20*time.Second {
			unsent = rep // the send failed: merged into the next
			return
		}
		if err := h.intake.Report(context.Background(), rep); err != nil {
			t.Fatalf("an honest report was refused: %v", err)
		}
		for _, e := range rep.Engines {
			responses += e.Responses
			errs += e.Errors
		}
	}
	for steps := 0; !in.done() && steps < 400; steps++ {
		// The reporter flushes at least every 2 s.
		if h.now.Sub(lastFlush) >= 2*time.Second {
			flush(in.next()%4 == 0)
		}
		switch op := in.next() % 8; {
		case op < 4:
			// At most 16 requests with log entries on the way (Envoy
			// sends its logs within a flush interval).
			for len(owners) >= 16 {
				deliver(0)
			}
			h.now = h.now.Add(time.Millisecond) // within the frontend's 1000/s
			st := &stream{start: h.now, kind: body.Chat, prioHdr: []string{"", "high", "low"}[in.next()%3]}
			h.s.onRequestBody(st, honestBody(in))
			if st.id == "" {
				continue // answered (shed or invalid): no upstream
			}
			for a := 0; ; a++ {
				up := h.addrs[in.next()%len(h.addrs)]
				last := a >= st.dc.Retries
				var code uint32
				var flags *accesslogdatav3.ResponseFlags
				switch in.next() % 6 {
				case 0, 1: // served to the end
					var f *accesslogdatav3.ResponseFlags
					if in.next()%4 == 0 {
						f = &accesslogdatav3.ResponseFlags{DownstreamConnectionTermination: true}
					}
					pending = append(pending, envoyEvent{true, logEntry(st.id, up, 200, f, 30*time.Millisecond, time.Second)})
					owners[st.id]++
				case 2: // 5xx before the headers
					code = 500 + uint32(in.next()%4)
				case 3: // reset before the headers
					flags = &accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true}
				case 4: // cut after the headers: no retry
					failures++
					f := &accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true}
					pending = append(pending, envoyEvent{false, logEntry(st.id, up, 200, f, 30*time.Millisecond, 0)},
						envoyEvent{true, logEntry(st.id, up, 200, f, 30*time.Millisecond, 0)})
					owners[st.id] += 2
				case 5: // no healthy host: Envoy answers 503 itself
					up = ""
					f := &accesslogdatav3.ResponseFlags{NoHealthyUpstream: true}
					pending = append(pending, envoyEvent{false, logEntry(st.id, "", 503, f, 0, 0)},
						envoyEvent{true, logEntry(st.id, "", 503, f, 0, 0)})
					owners[st.id] += 2
				}
				if up != "" && (code != 0 || flags == nil || !flags.NoHealthyUpstream) {
					attempts++
				}
				if code == 0 && flags == nil {
					break // the request ended above
				}
				failures++
				pending = append(pending, envoyEvent{false, logEntry(st.id, up, code, flags, 0, 0)})
				owners[st.id]++
				if last {
					pending = append(pending, envoyEvent{true, logEntry(st.id, up, code, flags, 0, 0)})
					owners[st.id]++
					break
				}
			}
		case op == 4 && len(pending) > 0:
			deliver(in.next() % len(pending))
		case op == 5:
			h.now = h.now.Add(time.Duration(1+in.next()) * 10 * time.Millisecond)
		case op == 6:
			flush(in.next()%3 == 0)
		default:
			for len(pending) > 0 {
				deliver(0)
			}
		}
	}
	for len(pending) > 0 {
		deliver(0)
	}
	h.now = h.now.Add(time.Second)
	flush(false)
	if responses != attempts || errs != failures {
		t.Fatalf("reports: %d responses, %d errors; Envoy made %d attempts at engines, %d failed", responses, errs, attempts, failures)
	}
}

// FuzzHonestReports: whatever the traffic and Envoy's outcomes, the
// reports the real ext_proc sends pass the control plane's plausibility
// checks with the bounds the control plane sets for the fleet.
func FuzzHonestReports(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x01\x02\x03\x00\x02\x00\x00\x01\x02\x02\x06\x00"))
	// A message ending exactly at a chain depth, repeated (the agentic
	// scenario's "2 requests beyond the error bound"), and absurd max_tokens.
	f.Add([]byte("\x00\x00\x01\x02\x02\x00\x00\x02\x00\x00\x00\x00\x01\x02\x02\x00\x00\x02\x00\x06\x00"))
	f.Add([]byte("\x00\x00\x00\x01\x03\x07\x07\x07\x02\x03\x04\x00\x02\x00\x03\x04\x00\x04\x00\x06"))
	for i := 0; i < 8; i++ {
		seed := make([]byte, 200)
		for j := range seed {
			seed[j] = byte((j*31 + i*17) ^ (j >> 2))
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) { runHonest(t, data) })
}

// The same as a property over pseudo-random programs (the fuzz seeds run
// in every `go test`; this covers more ground cheaply).
func TestHonestReportsAccepted(t *testing.T) {
	x := uint64(0x9e3779b97f4a7c15)
	for run := 0; run < 30; run++ {
		data := make([]byte, 1500)
		for i := range data {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			data[i] = byte(x)
		}
		runHonest(t, data)
	}
}
