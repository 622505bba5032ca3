package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/server"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// engines starts n loopback HTTP servers answering /health with 200.
func engines(t *testing.T, n int) []string {
	var out []string
	for range n {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, "ok")
		}))
		t.Cleanup(s.Close)
		out = append(out, strings.TrimPrefix(s.URL, "http://"))
	}
	return out
}

func testOptions() translate.Options {
	o := translate.DefaultOptions()
	o.HealthCheck.Interval = 200 * time.Millisecond
	o.HealthCheck.Timeout = 200 * time.Millisecond
	o.HealthCheck.HealthyThreshold = 1
	return o
}

func node(id, region string, addrs []string, shares []float64) translate.Node {
	n := translate.Node{NodeID: id, Region: region, Engines: map[string]translate.Engine{},
		PolicyVersion: "1", GeneratedAt: time.Unix(1764430000, 0)}
	w := map[string]float64{}
	for i, a := range addrs {
		eid := fmt.Sprintf("e%d", i)
		n.Engines[eid] = translate.Engine{ID: eid, Address: a, Region: "r1"}
		w[eid] = shares[i]
	}
	n.Classes = []translate.Class{{Name: "chat", Model: "m", Weights: w}}
	return n
}

func wantWeights(e *envoytest.Envoy, cluster string, want map[string]uint32) error {
	cs, err := xdstest.Clusters(e)
	if err != nil {
		return err
	}
	hosts, ok := cs[cluster]
	if !ok {
		return fmt.Errorf("no cluster %s yet", cluster)
	}
	for addr, w := range want {
		if hosts[addr].Weight != w {
			return fmt.Errorf("%s weight %d, want %d (all: %+v)", addr, hosts[addr].Weight, w, hosts)
		}
	}
	return nil
}

// Two frontends, one on state-of-the-world ADS and one on delta ADS, get
// their own weights.
func TestTwoNodesGetTheirOwnWeights(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // registered first, so it runs after the other cleanups
	srv, addr := xdstest.StartServer(t, server.Config{})
	eng := engines(t, 3)
	ctx := context.Background()
	o := testOptions()
	a, err := translate.Translate(node("fe-a", "r1", eng, []float64{0.6, 0.3, 0.1}), o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := translate.Translate(node("fe-b", "r2", eng, []float64{0.1, 0.2, 0.7}), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*translate.Resources{a, b} {
		if err := srv.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	ea := envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{NodeID: "fe-a", Region: "r1", XDSAddress: addr})})
	eb := envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{NodeID: "fe-b", Region: "r2", XDSAddress: addr, Delta: true})})
	poll := func(e *envoytest.Envoy, want map[string]uint32) {
		t.Helper()
		if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
			return wantWeights(e, "inferlb_chat", want)
		}); err != nil {
			t.Fatal(err)
		}
	}
	poll(ea, map[string]uint32{eng[0]: 600, eng[1]: 300, eng[2]: 100})
	poll(eb, map[string]uint32{eng[0]: 100, eng[1]: 200, eng[2]: 700})

	// A new allocation reaches both, and both ACK it.
	a2, _ := translate.Translate(node("fe-a", "r1", eng, []float64{0.2, 0.2, 0.6}), o)
	b2, _ := translate.Translate(node("fe-b", "r2", eng, []float64{0.5, 0.5, 0}), o)
	for _, r := range []*translate.Resources{a2, b2} {
		if err := srv.Publish(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	poll(ea, map[string]uint32{eng[0]: 200, eng[1]: 200, eng[2]: 600})
	poll(eb, map[string]uint32{eng[0]: 500, eng[1]: 500})
	cs, _ := xdstest.Clusters(eb)
	if h := cs["inferlb_chat"][eng[2]]; h.Priority != 1 || h.Weight != 1 {
		t.Errorf("zero-share engine: priority %d weight %d, want priority 1 weight 1", h.Priority, h.Weight)
	}
	if err := envoytest.Poll(ctx, 5*time.Second, 20*time.Millisecond, func() error {
		for _, st := range srv.Status() {
			want := map[string]string{"fe-a": a2.EndpointVersion, "fe-b": b2.EndpointVersion}[st.NodeID]
			if st.Acked["eds"] != want {
				return fmt.Errorf("%s acked eds %q, want %q", st.NodeID, st.Acked["eds"], want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A NACKed update is counted, visible in the status, and Envoy keeps the
// last good weights.
func TestNACKKeepsLastGoodConfig(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // registered first, so it runs after the other cleanups
	reg := prometheus.NewRegistry()
	srv, addr := xdstest.StartServer(t, server.Config{Registry: reg})
	eng := engines(t, 2)
	ctx := context.Background()
	good, _ := translate.Translate(node("fe", "r1", eng, []float64{0.7, 0.3}), testOptions())
	if err := srv.Publish(ctx, good); err != nil {
		t.Fatal(err)
	}
	e := envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{NodeID: "fe", Region: "r1", XDSAddress: addr})})
	if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		return wantWeights(e, "inferlb_chat", map[string]uint32{eng[0]: 700, eng[1]: 300})
	}); err != nil {
		t.Fatal(err)
	}
	// An EDS address must be an IP: Envoy rejects a name, which the
	// protos' own constraints (checked by Publish) let through.
	bad, _ := translate.Translate(node("fe", "r1", eng, []float64{0.2, 0.8}), testOptions())
	bad.Endpoints[0].Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().Address = "not-an-ip"
	bad.EndpointVersion = "broken"
	if err := srv.Publish(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if n := sumMetric(t, reg, "inferlb_xds_nacks_total"); n < 1 {
			return fmt.Errorf("nacks_total = %v", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	st := srv.Status()
	if len(st) != 1 || len(st[0].NACKs) != 1 || st[0].NACKs[0].Version != "broken" || st[0].NACKs[0].Message == "" {
		t.Fatalf("status after NACK: %+v", st)
	}
	if st[0].Acked["eds"] != good.EndpointVersion {
		t.Errorf("acked eds %q, want the last good %q", st[0].Acked["eds"], good.EndpointVersion)
	}
	t.Logf("NACK: %s", st[0].NACKs[0].Message)
	if err := wantWeights(e, "inferlb_chat", map[string]uint32{eng[0]: 700, eng[1]: 300}); err != nil {
		t.Fatalf("after NACK: %v", err)
	}
	// The next good update reaches Envoy, and by then the rejected one was
	// not sent again: one NACK, not a resend loop.
	next, _ := translate.Translate(node("fe", "r1", eng, []float64{0.4, 0.6}), testOptions())
	if err := srv.Publish(ctx, next); err != nil {
		t.Fatal(err)
	}
	if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		return wantWeights(e, "inferlb_chat", map[string]uint32{eng[0]: 400, eng[1]: 600})
	}); err != nil {
		t.Fatalf("good update after a NACK: %v", err)
	}
	if n := sumMetric(t, reg, "inferlb_xds_nacks_total"); n != 1 {
		t.Errorf("nacks_total = %v after one rejected update: the server sent it again", n)
	}
	// Envoy applies the update before its ACK reaches the server: wait for it.
	if err := envoytest.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if st := srv.Status(); st[0].NACKs[0].Count != 1 || st[0].Acked["eds"] != next.EndpointVersion {
			return fmt.Errorf("status after the good update: %+v", st[0])
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// sumMetric adds up a counter family in reg.
func sumMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.Metric {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

type sink struct {
	mu   sync.Mutex
	reqs []*policyv1.ReportRequest
}

func (s *sink) Report(_ context.Context, r *policyv1.ReportRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Instance == "bad" {
		return fmt.Errorf("instance %q rejected", r.Instance)
	}
	s.reqs = append(s.reqs, r)
	return nil
}

// The RoutingPolicy is served over ADS from the same listener, and the
// Reports service answers with the node's policy version.
func TestPolicyAndReports(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // registered first, so it runs after the other cleanups
	sk := &sink{}
	srv, addr := xdstest.StartServer(t, server.Config{Reports: sk})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, _ := translate.Translate(node("fe", "r1", []string{"127.0.0.1:1"}, []float64{1}), testOptions())
	r.Policy.Version = "42"
	if err := srv.Publish(ctx, r); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	resp, err := policyv1.NewReportsClient(conn).Report(ctx, &policyv1.ReportRequest{NodeId: "fe", Instance: "x"})
	if err != nil || resp.PolicyVersion != "42" {
		t.Fatalf("Report: %v %v", resp, err)
	}
	if _, err := policyv1.NewReportsClient(conn).Report(ctx, &policyv1.ReportRequest{NodeId: "fe", Instance: "bad"}); err == nil || !strings.Contains(err.Error(), `instance "bad" rejected`) {
		t.Fatalf("bad report: %v", err)
	}
	if _, err := policyv1.NewReportsClient(conn).Report(ctx, &policyv1.ReportRequest{}); err == nil || !strings.Contains(err.Error(), "node_id is empty") {
		t.Fatalf("empty node: %v", err)
	}

	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "fe"}, TypeUrl: policyv1.TypeURL, ResourceNames: []string{"fe"}}); err != nil {
		t.Fatal(err)
	}
	dr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(dr.Resources) != 1 {
		t.Fatalf("got %d resources", len(dr.Resources))
	}
	var p policyv1.RoutingPolicy
	if err := dr.Resources[0].UnmarshalTo(&p); err != nil {
		t.Fatal(err)
	}
	if p.NodeId != "fe" || p.Version != "42" || len(p.Classes) != 1 || p.Classes[0].Cluster != "inferlb_chat" {
		t.Fatalf("policy: %v", &p)
	}
	_ = stream.CloseSend()

	// Delta ADS serves the policy too (ext_proc may use either).
	ds, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "fe"}, TypeUrl: policyv1.TypeURL, ResourceNamesSubscribe: []string{"fe"}}); err != nil {
		t.Fatal(err)
	}
	ddr, err := ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(ddr.Resources) != 1 || ddr.Resources[0].Name != "fe" {
		t.Fatalf("delta policy: %v", ddr)
	}
	if err := ddr.Resources[0].Resource.UnmarshalTo(&p); err != nil || p.Version != "42" {
		t.Fatalf("delta policy: %v %v", &p, err)
	}
	// A new policy reaches the delta subscriber.
	r.Policy.Version = "43"
	if err := srv.Publish(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := ds.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: policyv1.TypeURL, ResponseNonce: ddr.Nonce}); err != nil {
		t.Fatal(err)
	}
	ddr, err = ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := ddr.Resources[0].Resource.UnmarshalTo(&p); err != nil || p.Version != "43" {
		t.Fatalf("updated delta policy: %v %v", &p, err)
	}
	_ = ds.CloseSend()
	cancel()
	_ = net.ErrClosed
}

// Publishing what the server already holds sends nothing and keeps the time
// of the last change, so the control loop can publish every node every
// cycle (and so retry one whose publication failed).
func TestRepublishingTheSameResourcesIsANoOp(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, _ := xdstest.StartServer(t, server.Config{Registry: reg})
	ctx := context.Background()
	r, err := translate.Translate(node("fe", "r1", []string{"127.0.0.1:1", "127.0.0.1:2"}, []float64{0.6, 0.4}), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Publish(ctx, r); err != nil {
		t.Fatal(err)
	}
	first := srv.Status()[0].Published
	n := sumMetric(t, reg, "inferlb_xds_publishes_total")
	if n != 3 { // cds, eds and policy
		t.Fatalf("first publication counted %v, want 3", n)
	}
	same, _ := translate.Translate(node("fe", "r1", []string{"127.0.0.1:1", "127.0.0.1:2"}, []float64{0.6, 0.4}), testOptions())
	if err := srv.Publish(ctx, same); err != nil {
		t.Fatal(err)
	}
	if got := sumMetric(t, reg, "inferlb_xds_publishes_total"); got != n {
		t.Errorf("republishing counted %v publications, want still %v", got, n)
	}
	if again := srv.Status()[0].Published; again != first {
		t.Errorf("republishing changed the published state: %+v, was %+v", again, first)
	}
}

// A resource Envoy would reject on its proto constraints is refused at
// Publish with the field named, and nothing is sent.
func TestPublishRefusesWhatEnvoyWouldReject(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	srv, _ := xdstest.StartServer(t, server.Config{Registry: prometheus.NewRegistry()})
	eng := engines(t, 2)
	r, err := translate.Translate(node("fe", "r1", eng, []float64{0.7, 0.3}), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	r.Endpoints[0].Endpoints[0].LbEndpoints[0].LoadBalancingWeight = wrapperspb.UInt32(0)
	err = srv.Publish(context.Background(), r)
	if err == nil || !strings.Contains(err.Error(), "LoadBalancingWeight") || !strings.Contains(err.Error(), "load assignment") {
		t.Fatalf("Publish of a weight-0 endpoint: %v; want an error naming the load assignment and LoadBalancingWeight", err)
	}
	if st := srv.Status(); len(st) != 0 && st[0].Published.EndpointVersion == r.EndpointVersion {
		t.Errorf("the refused version was published: %+v", st)
	}
}
