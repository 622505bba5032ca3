// Package xdstest helps tests run inferlb's xDS server against a real Envoy
// (internal/envoytest): a frontend bootstrap that takes CDS and EDS over ADS
// from the control plane, a server started on a loopback port, and readers
// of Envoy's /clusters view. Other packages' Envoy tests (ext_proc) use it
// too.
package xdstest

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/server"
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
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

// Host is one endpoint as Envoy's /clusters shows it.
type Host struct {
	Address  string // ip:port
	Hostname string
	Weight   uint32
	Priority uint32
	// EDSHealth is the health status the control plane sent.
	EDSHealth string
	// FailedActiveHC and FailedOutlier are Envoy's own verdicts.
	FailedActiveHC bool
	FailedOutlier  bool
	PendingHC      bool
}

// Routable says whether Envoy would send traffic to the host.
func (h Host) Routable() bool {
	return !h.FailedActiveHC && !h.FailedOutlier && (h.EDSHealth == "HEALTHY" || h.EDSHealth == "UNKNOWN")
}

// Clusters reads /clusters?format=json: cluster name → address → host.
func Clusters(e *envoytest.Envoy) (map[string]map[string]Host, error) {
	b, err := e.Admin("/clusters?format=json")
	if err != nil {
		return nil, err
	}
	var cs adminv3.Clusters
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &cs); err != nil {
		return nil, fmt.Errorf("parse /clusters: %w", err)
	}
	out := map[string]map[string]Host{}
	for _, c := range cs.ClusterStatuses {
		hosts := map[string]Host{}
		for _, h := range c.HostStatuses {
			sa := h.GetAddress().GetSocketAddress()
			addr := net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
			hs := h.GetHealthStatus()
			hosts[addr] = Host{
				Address: addr, Hostname: h.Hostname, Weight: h.Weight, Priority: h.Priority,
				EDSHealth:      hs.GetEdsHealthStatus().String(),
				FailedActiveHC: hs.GetFailedActiveHealthCheck(),
				FailedOutlier:  hs.GetFailedOutlierCheck(),
				PendingHC:      hs.GetPendingActiveHc(),
			}
		}
		out[c.Name] = hosts
	}
	return out, nil
}
