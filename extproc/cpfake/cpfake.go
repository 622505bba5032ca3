// Package cpfake is a small stand-in control plane for extproc's tests and
// `inferlb bench extproc`, built on go-control-plane's caches and server
// (real gRPC on loopback): CDS/EDS for class clusters (Maglev with
// hash_balance_factor) from a SnapshotCache, RoutingPolicy from a
// LinearCache (both over one ADS server), and a Reports service that records
// what it receives. The real control plane is `inferlb control-plane`.
package cpfake

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Endpoint is one engine of a cluster.
type Endpoint struct {
	Addr   string // "127.0.0.1:port"
	Weight uint32
}

// Cluster is one class cluster.
type Cluster struct {
	Name      string
	Endpoints []Endpoint
	// HashBalanceFactor (percent, ≥ 100; 0 = unbounded) bounds a host's load
	// at factor/100 × the average.
	HashBalanceFactor uint32
	// OutlierDetection enables consecutive-5xx ejection.
	OutlierDetection bool
}

// ControlPlane is a running test control plane.
type ControlPlane struct {
	Addr     string
	snap     cachev3.SnapshotCache
	policy   *cachev3.LinearCache
	grpc     *grpc.Server
	lis      net.Listener
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once

	mu      sync.Mutex
	reports []*policyv1.ReportRequest
	version int
}

type reports struct {
	policyv1.UnimplementedReportsServer
	cp *ControlPlane
}

// Report keeps req, counting a resent report once as the control plane's
// intake does (signals.Intake.Report): one with the node, instance and
// interval_start of a kept report replaces it if it ends later, else it is
// a late copy and dropped.
func (r *reports) Report(_ context.Context, req *policyv1.ReportRequest) (*policyv1.ReportResponse, error) {
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	for i, x := range r.cp.reports {
		if x.NodeId == req.NodeId && x.Instance == req.Instance && x.IntervalStart.AsTime().Equal(req.IntervalStart.AsTime()) {
			if req.IntervalEnd.AsTime().After(x.IntervalEnd.AsTime()) {
				r.cp.reports[i] = req
			}
			return &policyv1.ReportResponse{}, nil
		}
	}
	r.cp.reports = append(r.cp.reports, req)
	return &policyv1.ReportResponse{}, nil
}

// Start serves on a free loopback port (or addr, if given: for restarts on
// the same address) and stops when the test ends.
func Start(t testing.TB, addr string) *ControlPlane {
	t.Helper()
	cp, err := New(addr)
	if err != nil {
		t.Fatalf("cpfake: %v", err)
	}
	t.Cleanup(cp.Stop)
	return cp
}

// New serves on addr ("" = a free loopback port) until Stop.
func New(addr string) (*ControlPlane, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old process may still hold the port for a moment
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cp := &ControlPlane{
		Addr:   lis.Addr().String(),
		snap:   cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil),
		policy: cachev3.NewLinearCache(policyv1.TypeURL),
		lis:    lis, cancel: cancel,
	}
	mux := &cachev3.MuxCache{
		Classify: func(r *cachev3.Request) string {
			if r.TypeUrl == policyv1.TypeURL {
				return "policy"
			}
			return "envoy"
		},
		ClassifyDelta: func(r *cachev3.DeltaRequest) string {
			if r.TypeUrl == policyv1.TypeURL {
				return "policy"
			}
			return "envoy"
		},
		Caches: map[string]cachev3.Cache{"envoy": cp.snap, "policy": cp.policy},
	}
	srv := serverv3.NewServer(ctx, mux, nil)
	cp.grpc = grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(cp.grpc, srv)
	policyv1.RegisterReportsServer(cp.grpc, &reports{cp: cp})
	cp.wg.Add(1)
	go func() { defer cp.wg.Done(); _ = cp.grpc.Serve(lis) }()
	return cp, nil
}

// Stop ends the server (idempotent).
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		cp.cancel()
		cp.grpc.Stop()
		cp.wg.Wait()
	})
}

// SetClusters publishes CDS and EDS for a node.
func (cp *ControlPlane) SetClusters(nodeID string, clusters []Cluster) error {
	cp.mu.Lock()
	cp.version++
	v := strconv.Itoa(cp.version)
	cp.mu.Unlock()
	var cds, eds []types.Resource
	for _, c := range clusters {
		cl := &clusterv3.Cluster{
			Name:                 c.Name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
				ResourceApiVersion:    corev3.ApiVersion_V3,
				ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			}},
			ConnectTimeout: durationpb.New(time.Second),
			LbPolicy:       clusterv3.Cluster_MAGLEV,
			// Envoy's defaults (3 concurrent retries, 1024 requests) would
			// cap tests, not the ext_proc's retry allowance.
			CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
				MaxRequests: wrapperspb.UInt32(100000), MaxPendingRequests: wrapperspb.UInt32(100000),
				MaxConnections: wrapperspb.UInt32(100000), MaxRetries: wrapperspb.UInt32(1000),
			}}},
			CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
				UpdateMergeWindow: durationpb.New(0),
			},
		}
		if c.HashBalanceFactor > 0 {
			cl.CommonLbConfig.ConsistentHashingLbConfig = &clusterv3.Cluster_CommonLbConfig_ConsistentHashingLbConfig{
				HashBalanceFactor: wrapperspb.UInt32(c.HashBalanceFactor),
			}
		}
		if c.OutlierDetection {
			cl.OutlierDetection = &clusterv3.OutlierDetection{
				Consecutive_5Xx:    wrapperspb.UInt32(5),
				Interval:           durationpb.New(time.Second),
				BaseEjectionTime:   durationpb.New(30 * time.Second),
				MaxEjectionPercent: wrapperspb.UInt32(50),
			}
		}
		cds = append(cds, cl)
		cla := &endpointv3.ClusterLoadAssignment{ClusterName: c.Name}
		var lbs []*endpointv3.LbEndpoint
		for _, e := range c.Endpoints {
			host, portS, err := net.SplitHostPort(e.Addr)
			if err != nil {
				return err
			}
			port, _ := strconv.Atoi(portS)
			lbs = append(lbs, &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
					Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
					}},
				}}},
				LoadBalancingWeight: wrapperspb.UInt32(e.Weight),
			})
		}
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
		eds = append(eds, cla)
	}
	snap, err := cachev3.NewSnapshot(v, map[resourcev3.Type][]types.Resource{
		resourcev3.ClusterType:  cds,
		resourcev3.EndpointType: eds,
	})
	if err != nil {
		return err
	}
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("cpfake: %w", err)
	}
	return cp.snap.SetSnapshot(context.Background(), nodeID, snap)
}

// SetPolicy publishes a node's RoutingPolicy (resource name = node id).
func (cp *ControlPlane) SetPolicy(p *policyv1.RoutingPolicy) error {
	return cp.policy.UpdateResource(p.GetNodeId(), p)
}

// Reports returns the reports received so far (a resent one in place of
// the one it extends).
func (cp *ControlPlane) Reports() []*policyv1.ReportRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*policyv1.ReportRequest(nil), cp.reports...)
}
