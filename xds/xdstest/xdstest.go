// Package xdstest helps tests run inferlb's xDS server against a real Envoy
// (internal/envoytest): a frontend bootstrap that takes CDS and EDS over ADS
// from the control plane, a server started on a loopback port, and readers
// of Envoy's /clusters view. Other packages' Envoy tests (ext_proc) use it
// too.
package xdstest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
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
	// ListenerPort, if non-zero, adds an HTTP listener on 127.0.0.1 whose
	// route takes the cluster from the x-inferlb-cluster header and hashes
	// on x-inferlb-affinity-key, like a frontend's route.
	ListenerPort int
	// Retries on the route (retriable: connect-failure, reset, 5xx), with
	// the previous-hosts predicate.
	Retries int
}

// Bootstrap returns an Envoy bootstrap (without admin; envoytest adds it).
func Bootstrap(o BootstrapOptions) string {
	api := "GRPC"
	if o.Delta {
		api = "DELTA_GRPC"
	}
	host, port, _ := net.SplitHostPort(o.XDSAddress)
	var b strings.Builder
	fmt.Fprintf(&b, `node:
  id: %q
  cluster: %q
  locality: { region: %q }
dynamic_resources:
  ads_config:
    api_type: %s
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: { cluster_name: xds_cluster }
  cds_config:
    ads: {}
    resource_api_version: V3
static_resources:
  clusters:
  - name: xds_cluster
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: xds_cluster
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: %q, port_value: %s } } }
`, o.NodeID, o.NodeID, o.Region, api, host, port)
	if o.ListenerPort != 0 {
		fmt.Fprintf(&b, `  listeners:
  - name: ingress
    address: { socket_address: { address: 127.0.0.1, port_value: %d } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster_header: %s
                  timeout: 0s
                  hash_policy:
                  - header: { header_name: %s }
                  retry_policy:
                    retry_on: connect-failure,reset,5xx
                    num_retries: %d
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, o.ListenerPort, headers.Cluster, headers.AffinityKey, o.Retries)
	}
	return b.String()
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

// ControlPlane is inferlb's xDS server (package server) on a loopback port,
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

func (r reportLog) Report(_ context.Context, req *policyv1.ReportRequest) error {
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	r.cp.reports = append(r.cp.reports, req)
	return nil
}

// Stop ends the server (idempotent; the test's end stops it too).
func (cp *ControlPlane) Stop() { cp.Server.Stop() }

// SetClusters publishes node's CDS and EDS: one cluster per class (named
// ClusterPrefix + class), hash_balance_factor hbf (0 = off), the other
// settings production's defaults. The node's policy stays.
func (cp *ControlPlane) SetClusters(node string, hbf uint32, classes ...translate.FixedClass) error {
	o := translate.DefaultOptions()
	o.ClusterPrefix, o.HashBalanceFactor = ClusterPrefix, hbf
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

// Reports returns the reports received so far.
func (cp *ControlPlane) Reports() []*policyv1.ReportRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*policyv1.ReportRequest(nil), cp.reports...)
}

// Host is one endpoint as Envoy's /clusters shows it.
type Host = envoyrun.Host

// Clusters reads /clusters?format=json: cluster name → address → host.
func Clusters(e *envoytest.Envoy) (map[string]map[string]Host, error) { return e.Clusters() }
