package drills

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/auth/authtest"
)

// forgery is one forged report and what the control plane must answer.
type forgery struct {
	name string
	req  *policyv1.ReportRequest
	code codes.Code
	msg  string // in the status message
}

// Item 1: forged reports. Without the token nothing gets through (Reports
// or ADS); with it (a compromised or broken reporter), the issue's
// forgeries — 2^64−1 requests, 10^9 per second, timestamps in 1970 and a
// century ahead, 1000 errors per engine without requests — are refused
// with a precise status, counted and logged, while real traffic at both
// priorities goes on: the top priority is never shed and no engine gets a
// penalty.
func TestDrillForgedReports(t *testing.T) {
	s := startStack(t, stackOptions{auth: "token", frontendMaxRPS: 60})
	tr := s.startTraffic(trafficOptions{rate: 6, maxTokens: 16, mix: map[string]float64{"high": 0.5, "low": 0.5}})
	tr.waitSent(t, 12, 20*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	anon := s.dialCP(t, auth.Client{Insecure: true})
	insider := s.dialCP(t, auth.Client{TokenFile: s.auth.tokenFile})

	// Without credentials: no reports, no configuration.
	now := time.Now()
	ok := &policyv1.ReportRequest{NodeId: nodeID, Instance: "forger", IntervalStart: timestamppb.New(now.Add(-time.Second)),
		IntervalEnd: timestamppb.New(now), Demand: []*policyv1.DemandSample{{Class: "chat", Priority: "high", Requests: 1}}}
	if _, err := policyv1.NewReportsClient(anon).Report(ctx, ok); status.Code(err) != codes.Unauthenticated {
		t.Errorf("report without the token: %v, want Unauthenticated", err)
	}
	ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(anon).StreamAggregatedResources(ctx)
	if err == nil {
		_ = ads.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: nodeID}, TypeUrl: policyv1.TypeURL, ResourceNames: []string{nodeID}})
		_, err = ads.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("ADS without the token: %v, want Unauthenticated", err)
	}

	// With the token: twenty implausible reports, each refused.
	var engines []*policyv1.EngineEvidence
	for _, e := range s.engines {
		engines = append(engines, &policyv1.EngineEvidence{Address: e.Addr(), Responses: 1000, Errors: 1000})
	}
	mk := func(start, end time.Time, req uint64, ev []*policyv1.EngineEvidence) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: nodeID, Instance: "forger", IntervalStart: timestamppb.New(start), IntervalEnd: timestamppb.New(end),
			Demand: []*policyv1.DemandSample{{Class: "chat", Priority: "high", Requests: req}}, Engines: ev}
	}
	var forged []forgery
	for i := 0; i < 5; i++ {
		now := time.Now()
		forged = append(forged,
			forgery{"2^64-1 requests", mk(now.Add(-time.Second), now, math.MaxUint64, nil), codes.InvalidArgument, "exceed the 60/s frontend fe-east can carry"},
			forgery{"1e9 per second", mk(now.Add(-time.Second), now, 1_000_000_000, nil), codes.InvalidArgument, "exceed the 60/s"},
			forgery{"in 1970", mk(time.Unix(0, 0), time.Unix(1, 0), 1, nil), codes.InvalidArgument, "from the control plane's clock"},
			forgery{"a century ahead", mk(now.AddDate(100, 0, 0), now.AddDate(100, 0, 1), 1, nil), codes.InvalidArgument, "from the control plane's clock"},
		)
	}
	forged[len(forged)-1] = forgery{"1000 errors per engine", mk(time.Now().Add(-time.Second), time.Now(), 0, engines), codes.InvalidArgument,
		"engine responses, more than its 0 admitted requests"}
	rc := policyv1.NewReportsClient(insider)
	for _, f := range forged {
		_, err := rc.Report(ctx, f.req)
		if status.Code(err) != f.code || !strings.Contains(status.Convert(err).Message(), f.msg) {
			t.Errorf("forged report (%s): %v, want %v containing %q", f.name, err, f.code, f.msg)
		}
	}
	t.Logf("forged: %d reports refused, e.g. %q", len(forged), func() string {
		_, err := rc.Report(ctx, forged[0].req)
		return status.Convert(err).Message()
	}())

	// Real traffic goes on for a few control cycles after the forgeries.
	forgedAt := time.Now()
	tr.waitSent(t, tr.sentCount()+40, 30*time.Second)
	tally := tr.stop()
	t.Logf("traffic: %s", tally)
	if h := tally.byPriority["high"]; h == nil || h.shed != 0 || h.failed != 0 || h.cut != 0 {
		t.Errorf("top priority hurt by forged reports: %s", tally)
	}
	if tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests failed: %s", tally)
	}
	views, err := s.cycleView(0)
	if err != nil {
		t.Fatal(err)
	}
	for id, v := range views {
		if v.Penalty > 0 {
			t.Errorf("engine %s penalized after forged evidence: %.2f (%s)", id, v.Penalty, v.PenaltyWhy)
		}
	}
	// Counted and logged.
	metrics := s.cpAdmin[0] + "/metrics"
	for reason, want := range map[string]float64{"rate": 10, "clock": 9, "evidence": 1} {
		if n, err := metric(metrics, "inferlb_reports_rejected_total", fmt.Sprintf("reason=%q", reason)); err != nil || n < want {
			t.Errorf("inferlb_reports_rejected_total{reason=%q} = %v (%v), want ≥ %v", reason, n, err, want)
		}
	}
	if n, err := metric(metrics, "inferlb_xds_auth_failures_total"); err != nil || n < 2 {
		t.Errorf("inferlb_xds_auth_failures_total = %v (%v), want ≥ 2", n, err)
	}
	log := logOf(s.cps[0])
	for _, want := range []string{`msg="report rejected" node=fe-east instance=forger`, `reason=clock`, `reason=evidence`,
		`msg="xds: unauthenticated call refused"`, `method=/inferlb.policy.v1.Reports/Report`,
		`method=/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources`} {
		if !strings.Contains(log, want) {
			t.Errorf("control plane log lacks %s", want)
		}
	}
	t.Logf("forgeries refused from %v until the traffic ended %.1f s later", forgedAt.Format(time.TimeOnly), time.Since(forgedAt).Seconds())
}

// Mutual TLS on the xDS/Reports port: Envoy's ADS connection and ext_proc
// (policy and reports) come up with their client certificate; a client
// with a certificate of another CA, or none, gets nothing.
func TestDrillMutualTLS(t *testing.T) {
	s := startStack(t, stackOptions{auth: "mtls"})
	tr := s.startTraffic(trafficOptions{rate: 4, maxTokens: 8})
	for name, c := range map[string]auth.Client{
		"another CA's certificate": {CAFile: s.auth.pki.CA, CertFile: s.auth.pki.OtherCert, KeyFile: s.auth.pki.OtherKey},
		"no certificate":           {Insecure: true},
	} {
		conn := s.dialCP(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		now := time.Now()
		_, err := policyv1.NewReportsClient(conn).Report(ctx, &policyv1.ReportRequest{NodeId: nodeID, Instance: "intruder",
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now)})
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the connection refused", name, err)
		}
	}
	tr.waitSent(t, 20, 20*time.Second)
	tally := tr.stop()
	t.Logf("traffic over the mutual-TLS stack: %s", tally)
	if tally.all.ok != tally.sent {
		t.Errorf("requests failed: %s", tally)
	}
	// ext_proc's reports reached the control plane (demand is seen).
	if n, err := metric(s.cpAdmin[0]+"/metrics", "inferlb_reports_total"); err != nil || n < 1 {
		t.Errorf("no report reached the control plane over mutual TLS: %v %v", n, err)
	}
	if n, err := metric(s.cpAdmin[0]+"/metrics", "inferlb_xds_auth_failures_total", `method="tls-handshake"`); err != nil || n < 2 {
		t.Errorf("refused handshakes counted: %v (%v), want ≥ 2", n, err)
	}

	// The control plane's certificate rotates under the running stack: new
	// handshakes get the new one, Envoy's ADS connection is not cut.
	adsConns := func() string {
		b, err := s.envoy.Admin("/stats?filter=^cluster.inferlb_xds.upstream_cx_total$")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	before := adsConns()
	if !strings.HasPrefix(before, "cluster.inferlb_xds.upstream_cx_total: ") {
		t.Fatalf("Envoy's stat of its control-plane connections: %q", before)
	}
	renewed := s.auth.pki.RenewServer(t)
	if err := envoytest.Poll(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		leaf, err := s.cpLeaf()
		if err == nil && !bytes.Equal(leaf, renewed) {
			err = errors.New("still the old certificate")
		}
		return err
	}); err != nil {
		t.Fatalf("new handshake after the rotation: %v", err)
	}
	tr = s.startTraffic(trafficOptions{rate: 4, maxTokens: 8})
	tr.waitSent(t, 8, 20*time.Second)
	if tally := tr.stop(); tally.all.ok != tally.sent {
		t.Errorf("requests failed after the rotation: %s", tally)
	}
	if after := adsConns(); after != before {
		t.Errorf("Envoy reconnected to the control plane across the rotation: %q, then %q", before, after)
	} else {
		t.Logf("across the rotation: %s", after)
	}
	if n, err := metric(s.cpAdmin[0]+"/metrics", "inferlb_auth_reload_failing", `files="--tls-cert/--tls-key"`); err != nil || n != 0 {
		t.Errorf("inferlb_auth_reload_failing after the rotation: %v (%v), want 0", n, err)
	}
}

// cpLeaf makes a TLS handshake with the first control-plane replica, as a
// client of the stack's CA, and returns the certificate it presents.
func (s *stack) cpLeaf() ([]byte, error) {
	pki := s.auth.pki
	cert, err := tls.LoadX509KeyPair(pki.ClientCert, pki.ClientKey)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(pki.CA)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	d := &tls.Dialer{Config: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, ServerName: authtest.ServerName, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", s.cpXDS[0])
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].Raw, nil
}

// dialCP connects to the first control-plane replica with the client's
// credentials (closed when the test ends).
func (s *stack) dialCP(t *testing.T, c auth.Client) *grpc.ClientConn {
	t.Helper()
	opts, err := c.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.cpXDS[0], opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
