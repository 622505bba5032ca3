// Package xdstest helps tests run inferlb's xDS server against a real Envoy
// (internal/envoytest): the frontend bootstrap (envoy-configs, direct
// variant) taking CDS and EDS over ADS from the control plane, a server
// started on a loopback port, a control plane of fixed-weight class
// clusters, and Envoy's /clusters view. Test-only (it imports testing).
package xdstest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/server"
	"github.com/inferlb/inferlb/xds/translate"
)

// BootstrapOptions describe a test frontend node.
type BootstrapOptions struct {
	NodeID string
	// Region is the node's locality region (node.locality.region).
	Region string
	// XDSAddress is the control plane's gRPC "host:port".
	XDSAddress string
	// Delta selects incremental ADS (DELTA_GRPC) instead of state of the world.
	Delta bool
	// ListenerPort is the frontend listener's port on 127.0.0.1 (0: a free
	// one). Requests go to Cluster, hashed on x-session-id.
	ListenerPort int
	// Cluster is the class cluster requests take (default inferlb_chat:
	// class chat under production's cluster prefix).
	Cluster string
	// Retries on the route (connect-failure, reset, 5xx), to another host.
	Retries int
}

// Bootstrap renders the frontend bootstrap (envoy-configs, the project's
// one) in its direct variant: CDS and EDS over ADS from the control plane,
// the production listener, no ext_proc. Without admin; envoytest adds it.
func Bootstrap(t testing.TB, o BootstrapOptions) string {
	t.Helper()
	host, ps, err := net.SplitHostPort(o.XDSAddress)
	if err != nil {
		t.Fatalf("xdstest.Bootstrap: XDSAddress: %v", err)
	}
	port, _ := strconv.Atoi(ps)
	if o.ListenerPort == 0 {
		o.ListenerPort = envoytest.FreePort(t)
	}
	if o.Cluster == "" {
		o.Cluster = "inferlb_chat"
	}
	b, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.Direct, NodeID: o.NodeID, Region: o.Region,
		ListenPort: o.ListenerPort, XDSHost: host, XDSPort: port, XDSDelta: o.Delta, BodyLimit: 4 << 20,
		FallbackCluster: o.Cluster, FallbackRetries: o.Retries})
	if err != nil {
		t.Fatalf("xdstest.Bootstrap: %v", err)
	}
	return b
}

// StartServer runs an xDS server on a free loopback port until the test
// ends (without authentication unless cfg.Auth names credentials). It
// returns the server and its address.
func StartServer(t testing.TB, cfg server.Config) (*server.Server, string) {
	t.Helper()
	return startServer(t, cfg, "127.0.0.1:0")
}

// startServer serves on addr; a port a stopped server held a moment ago may
// still be in use, so binding is retried for a few seconds.
func startServer(t testing.TB, cfg server.Config, addr string) (*server.Server, string) {
	t.Helper()
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := cfg.Auth
	if a.CertFile == "" && a.ClientCAFile == "" && a.TokenFile == "" {
		// Tests of xDS behaviour run on loopback without credentials
		// (package auth and the drills test authentication).
		cfg.Auth.Insecure = true
	}
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var l net.Listener
	if err := envoytest.Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("xds server: %v", err)
		}
	})
	return s, l.Addr().String()
}

// ClusterPrefix names the class clusters of a ControlPlane: class "llama"
// is cluster "class-llama".
const ClusterPrefix = "class-"

// ControlPlane is inferlb's xDS server (package xds/server) on a loopback port,
// publishing class clusters with fixed engine weights built by
// xds/translate (the production builder) and RoutingPolicies the test
// writes: the control plane of tests that run no control cycle (ext_proc,
// the bootstrap, the policy subscriber). It records the reports it gets.
type ControlPlane struct {
	Addr   string
	Server *server.Server

	// mu guards last and reports.
	mu      sync.Mutex
	last    map[string]*translate.Resources // per node: what was published last
	reports []*policyv1.ReportRequest
}

// StartControlPlane serves on addr ("" = a free loopback port; a stopped
// control plane's address, to restart it) until Stop or the test's end.
func StartControlPlane(t testing.TB, addr string) *ControlPlane {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	cp := &ControlPlane{last: map[string]*translate.Resources{}}
	cp.Server, cp.Addr = startServer(t, server.Config{Reports: reportLog{cp}}, addr)
	return cp
}

type reportLog struct{ cp *ControlPlane }

// Report keeps req, counting a resent report once as the control plane's
// intake does (scrape.Intake.Report): one with the node, instance and
// interval_start of a kept report replaces it if it ends later, else it is
// a late copy and dropped (a report whose answer came after the reporter's
// deadline had arrived, and is resent merged into the next).
func (r reportLog) Report(_ context.Context, req *policyv1.ReportRequest) error {
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	for i, x := range r.cp.reports {
		if x.NodeId == req.NodeId && x.Instance == req.Instance && x.IntervalStart.AsTime().Equal(req.IntervalStart.AsTime()) {
			if req.IntervalEnd.AsTime().After(x.IntervalEnd.AsTime()) {
				r.cp.reports[i] = req
			}
			return nil
		}
	}
	r.cp.reports = append(r.cp.reports, req)
	return nil
}

// Stop ends the server (idempotent; the test's end stops it too).
func (cp *ControlPlane) Stop() { cp.Server.Stop() }

// SetClusters publishes node's CDS and EDS: one cluster per class (named
// ClusterPrefix + class), hash_balance_factor hbf (0 = off), the other
// settings production's defaults but the retry budget: Envoy's retry
// circuit breaker (10% of active requests, at least 3) would cap a test's
// retries under a loaded machine's bursts, where the test asserts the
// ext_proc's retry allowance. The node's policy stays.
func (cp *ControlPlane) SetClusters(node string, hbf uint32, classes ...translate.FixedClass) error {
	o := translate.DefaultOptions()
	o.ClusterPrefix, o.HashBalanceFactor = ClusterPrefix, hbf
	o.Circuit.RetryBudgetPercent, o.Circuit.MinRetryConcurrency = 100, 1000
	r, err := translate.Translate(translate.FixedNode(node, "", classes), o)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	r.Policy = nil
	if prev := cp.last[node]; prev != nil {
		r.Policy = prev.Policy
	}
	return cp.publish(r)
}

// SetPolicy publishes a node's RoutingPolicy (the node is p's node_id); the
// node's clusters stay.
func (cp *ControlPlane) SetPolicy(p *policyv1.RoutingPolicy) error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	r := &translate.Resources{NodeID: p.GetNodeId()}
	if prev := cp.last[r.NodeID]; prev != nil {
		c := *prev
		r = &c
	}
	r.Policy = p
	return cp.publish(r)
}

// publish: cp.mu held.
func (cp *ControlPlane) publish(r *translate.Resources) error {
	if err := cp.Server.Publish(context.Background(), r); err != nil {
		return err
	}
	cp.last[r.NodeID] = r
	return nil
}

// Reports returns the reports received so far (a resent one in place of
// the one it extends).
func (cp *ControlPlane) Reports() []*policyv1.ReportRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*policyv1.ReportRequest(nil), cp.reports...)
}

// Host is one endpoint as Envoy's /clusters shows it.
type Host = envoyrun.Host

// Clusters reads /clusters?format=json: cluster name → address → host.
func Clusters(e *envoytest.Envoy) (map[string]map[string]Host, error) { return e.Clusters() }
