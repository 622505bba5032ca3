package picker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc/picker"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// TestEndpointPickerSubsetHint: with the gateway's subset hint every pick
// comes from the subset, for conversations whose own engine is outside it
// too; a subset of endpoints the pool does not have is a 503.
func TestEndpointPickerSubsetHint(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{5, 3, 1, 1}, 0, 0)
	defer p.close()
	subset := []string{p.addrs[2], p.addrs[3]} // the two lightest: most keys are elsewhere
	for _, v := range variants {
		t.Run(v, func(t *testing.T) {
			pk := startServer(t, p.policy, true, fallbacks(v))
			defer pk.stop()
			gw := startGateway(t, envoyconfigs.PickerParams{Variant: v, PickerAddress: pk.addr, Endpoints: p.addrs, Subset: subset, Retries: 2})
			defer gw.envoy.Stop()
			waitServing(t, gw.url)
			got := map[string]int{}
			for i := 0; i < 30; i++ {
				r := post(gw.url, conversation(i), nil)
				if r.status != 200 {
					t.Fatalf("conversation %d: %d %s", i, r.status, r.body)
				}
				got[r.engine]++
			}
			if len(got) != 2 || got["e2"] == 0 || got["e3"] == 0 {
				t.Errorf("engines used %v, want e2 and e3 only (the subset)", got)
			}
		})
	}
	t.Run("outside the pool", func(t *testing.T) {
		pk := startServer(t, p.policy, true, 0)
		defer pk.stop()
		gw := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OriginalDst, PickerAddress: pk.addr, Subset: []string{deadAddr(t)}})
		defer gw.envoy.Stop()
		var r reply
		err := pollStatus(gw.url, 503, &r)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.body, "subset_unavailable") {
			t.Errorf("503 body %s, want code subset_unavailable", r.body)
		}
	})
}

// pollStatus polls until a request is answered with want (Envoy may take a
// moment to reach the picker).
func pollStatus(url string, want int, last *reply) error {
	return envoytest.Poll(context.Background(), 20*time.Second, 20*time.Millisecond, func() error {
		*last = post(url, conversation(0), nil)
		if last.status != want {
			return fmt.Errorf("status %d (%s), want %d", last.status, last.body, want)
		}
		return nil
	})
}

// TestEndpointPickerShedAndUnavailable: a shed request is answered 429 with
// Retry-After; with no healthy endpoint, 503; both through the gateway.
func TestEndpointPickerShedAndUnavailable(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{1, 1}, 0, 0)
	defer p.close()

	shed := proto.Clone(p.policy).(*policyv1.RoutingPolicy)
	shed.Classes[0].ShedFractionByLevel = map[uint32]float64{1: 1} // all of "standard"
	down := proto.Clone(p.policy).(*policyv1.RoutingPolicy)
	for _, e := range down.Classes[0].Endpoints {
		e.Healthy = false
	}
	for name, c := range map[string]struct {
		pol    *policyv1.RoutingPolicy
		status int
		code   string
	}{"shed": {shed, 429, "overloaded"}, "no healthy endpoint": {down, 503, "no_ready_endpoint"}} {
		t.Run(name, func(t *testing.T) {
			pk := startServer(t, c.pol, true, 0)
			defer pk.stop()
			gw := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OriginalDst, PickerAddress: pk.addr})
			defer gw.envoy.Stop()
			var r reply
			if err := pollStatus(gw.url, c.status, &r); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(r.body, `"code":"`+c.code+`"`) {
				t.Errorf("body %s, want code %s", r.body, c.code)
			}
			if r.header.Get("retry-after") == "" {
				t.Errorf("no Retry-After on the %d", c.status)
			}
			// An interactive request is not shed: the verdict is the policy's.
			if name == "shed" {
				if r := post(gw.url, conversation(1), map[string]string{"x-priority": "interactive"}); r.status != 200 {
					t.Errorf("interactive request: %d %s, want 200", r.status, r.body)
				}
			}
		})
	}
}

// TestEndpointPickerServedEvidence: the evidence the picker reports to the
// control plane names the engines that served, as the gateway reported
// them (x-gateway-destination-endpoint-served), not the picks: with the
// heaviest engine dead, its requests are served by fallbacks, and the
// evidence credits those.
func TestEndpointPickerServedEvidence(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{5, 3, 1, 1}, 1, 0)
	defer p.close()
	pk := startServer(t, p.policy, true, 2)
	defer pk.stop()
	gw := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: pk.addr, Endpoints: p.addrs, Retries: 2})
	defer gw.envoy.Stop()
	waitServing(t, gw.url)
	for _, e := range p.engines {
		e.arrived.Store(0)
	}
	pk.ext.Observer().Flush(time.Now())
	const n = 30
	for i := 0; i < n; i++ {
		if r := post(gw.url, conversation(i), nil); r.status != 200 {
			t.Fatalf("conversation %d: %d %s", i, r.status, r.body)
		}
	}
	// The picker sees the response end after the client does: poll.
	var rep *policyv1.ReportRequest
	byAddr := map[string]*policyv1.EngineEvidence{}
	err := pollUntil(func() error {
		r := pk.ext.Observer().Flush(time.Now())
		for _, e := range r.GetEngines() {
			if o := byAddr[e.Address]; o != nil {
				o.Responses += e.Responses
				o.Errors += e.Errors
				o.Completed += e.Completed
			} else {
				byAddr[e.Address] = e
			}
		}
		rep = r
		total := uint64(0)
		for _, e := range byAddr {
			total += e.Completed
		}
		if total < n {
			return fmt.Errorf("%d completions reported, want %d", total, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err, rep)
	}
	// The dead engine: every attempt there failed (its requests were served
	// by a fallback, which the served endpoint told), nothing completed.
	if e := byAddr[p.addrs[0]]; e == nil || e.Errors == 0 || e.Errors != e.Responses || e.Completed != 0 {
		t.Errorf("the dead engine's evidence %v, want only errors", e)
	}
	for _, e := range p.engines {
		ev := byAddr[e.addr()]
		if got, want := ev.GetResponses(), uint64(e.arrived.Load()); got != want {
			t.Errorf("engine %s: %d responses in the evidence, %d served", e.id, got, want)
		}
		if ev.GetEngineId() != e.id && e.arrived.Load() > 0 {
			t.Errorf("engine %s: evidence names %q", e.id, ev.GetEngineId())
		}
	}
}

func pollUntil(f func() error) error {
	return envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, f)
}

// TestEndpointPickerFailOpen: with the picker down, a gateway on
// override_host with failure_mode_allow still serves every request through
// its fallback policy (Maglev on the session header: a conversation stays
// on one engine); failing closed it serves none.
func TestEndpointPickerFailOpen(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{1, 1, 1}, 0, 0)
	defer p.close()
	gone := deadAddr(t)
	open := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: gone, Endpoints: p.addrs, FailOpen: true})
	defer open.envoy.Stop()
	closed := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: gone, Endpoints: p.addrs})
	defer closed.envoy.Stop()
	for i := 0; i < 10; i++ {
		s := map[string]string{"x-session-id": fmt.Sprint("conv-", i)}
		a, b := post(open.url, conversation(i), s), post(open.url, conversation(i), s)
		if a.status != 200 || b.status != 200 {
			t.Fatalf("fail-open, conversation %d: %d %s / %d %s", i, a.status, a.body, b.status, b.body)
		}
		if a.engine != b.engine {
			t.Errorf("fail-open, conversation %d: turns on %s and %s, want one engine", i, a.engine, b.engine)
		}
		if r := post(closed.url, conversation(i), s); r.status == 200 {
			t.Errorf("fail-closed, conversation %d: served without the picker", i)
		}
	}

	// The fail-open gateway buffers bodies (BUFFERED): with the picker up
	// it routes each conversation where the streaming one does.
	pk := startServer(t, p.policy, true, 2)
	defer pk.stop()
	buffered := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: pk.addr, Endpoints: p.addrs, FailOpen: true})
	defer buffered.envoy.Stop()
	streamed := startGateway(t, envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, PickerAddress: pk.addr, Endpoints: p.addrs})
	defer streamed.envoy.Stop()
	waitServing(t, streamed.url)
	before := counter(t, pk, "inferlb_picker_picks_total", `outcome="picked"`)
	for i := 0; i < 20; i++ {
		a, b := post(buffered.url, conversation(i), nil), post(streamed.url, conversation(i), nil)
		if a.status != 200 || a.engine != b.engine {
			t.Errorf("conversation %d: buffered %d %s, streamed %d %s", i, a.status, a.engine, b.status, b.engine)
		}
	}
	if got := counter(t, pk, "inferlb_picker_picks_total", `outcome="picked"`) - before; got != 40 {
		t.Errorf("%v picks for 40 requests: the buffered gateway did not ask the picker", got)
	}
}

// TestEndpointPickerHealth: the protocol's health services: liveness
// always, readiness and the ext_proc service once a policy is held, all
// NOT_SERVING once the picker shuts down.
func TestEndpointPickerHealth(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := newPool(t, []float64{1}, 0, 0)
	defer p.close()
	s := startServer(t, nil, true, 0)
	defer s.stop()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	check := func(want map[string]healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for svc, w := range want {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatalf("%s: %v", svc, err)
			}
			if r.Status != w {
				t.Errorf("%s: %v, want %v", svc, r.Status, w)
			}
		}
	}
	const serving, not = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	check(map[string]healthpb.HealthCheckResponse_ServingStatus{picker.LivenessService: serving, picker.ReadinessService: not, picker.ExtProcService: not})
	if err := s.ext.SetPolicy(p.policy); err != nil {
		t.Fatal(err)
	}
	s.pk.UpdateReadiness()
	check(map[string]healthpb.HealthCheckResponse_ServingStatus{picker.LivenessService: serving, picker.ReadinessService: serving, picker.ExtProcService: serving})
	s.pk.Shutdown()
	check(map[string]healthpb.HealthCheckResponse_ServingStatus{picker.LivenessService: not, picker.ReadinessService: not, picker.ExtProcService: not})
}
