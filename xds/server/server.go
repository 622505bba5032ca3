// Package server is inferlb's xDS server: one gRPC listener serving
//
//   - ADS (state of the world and delta) with CDS and EDS per frontend node
//     from go-control-plane's SnapshotCache (ADS mode, node id = hash);
//   - the RoutingPolicy custom type from a LinearCache, one resource per node
//     named after the node id (a MuxCache routes by type URL);
//   - the Reports service the ext_proc instances call with demand and
//     per-engine evidence.
//
// Server callbacks track every stream's node, the versions each node has
// ACKed per type, and NACKs (logged, counted in
// inferlb_xds_nacks_total{type}, kept with their error message for the admin
// view). A NACKed update changes nothing in Envoy: it keeps serving the last
// config it accepted, and the status keeps that version as "acked". The
// rejected update is not sent again (go-control-plane's snapshot cache
// would, in a loop, on every state-of-the-world NACK: parkNACKed decorates
// it); the next Publish replaces it.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/translate"
)

// ReportSink receives the ext_proc reports.
type ReportSink interface {
	Report(ctx context.Context, req *policyv1.ReportRequest) error
}

// Config configures New.
type Config struct {
	Logger *slog.Logger
	// Registry receives the server's metrics; required (never the global one).
	Registry *prometheus.Registry
	// Reports receives Reports calls; nil answers them with Unimplemented.
	Reports ReportSink
	// VersionPrefix distinguishes this process's RoutingPolicy cache
	// versions from a previous process's (the LinearCache counts from 0).
	VersionPrefix string
	// Auth secures the port (mutual TLS and/or a bearer token); it must be
	// set, or say Insecure explicitly. Refused calls and handshakes are
	// logged and counted in inferlb_xds_auth_failures_total{method}; its
	// credential files are re-read when they change, refused new content
	// logged and counted in inferlb_auth_reload_errors_total{files} (by
	// Auth.Reloads if set, else by one made in Registry).
	Auth auth.Server
}

// Server is the xDS + Reports gRPC server.
type Server struct {
	log     *slog.Logger
	snap    cachev3.SnapshotCache
	policy  *cachev3.LinearCache
	xds     serverv3.Server
	grpc    *grpc.Server
	reports ReportSink
	m       metrics

	// mu guards nodes and streams (and everything they point to): the
	// go-control-plane callbacks, Publish and Status all touch them.
	mu      sync.Mutex
	nodes   map[string]*nodeState
	streams map[streamKey]*streamState

	policyv1.UnimplementedReportsServer
}

type streamKey struct {
	delta bool
	id    int64
}

type streamState struct {
	node string
	// The latest response per type URL (a reply names the latest; its
	// version names what a NACK rejected).
	sent map[string]sentResponse
}

type sentResponse struct {
	nonce, version string
}

type nodeState struct {
	published Published
	acked     map[string]string // type URL → version
	ackedAt   map[string]time.Time
	nacks     map[string]*NACK
	streams   int
}

// Published is what was last set for a node.
type Published struct {
	ClusterVersion  string
	EndpointVersion string
	PolicyVersion   string
	At              time.Time
}

// NACK is the last rejection of a type by a node.
type NACK struct {
	TypeURL string    `json:"type_url"`
	Version string    `json:"rejected_version"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
	Count   int       `json:"count"`
}

// NodeStatus is one node's xDS status for the admin view.
type NodeStatus struct {
	NodeID    string               `json:"node_id"`
	Streams   int                  `json:"streams"`
	Published Published            `json:"published"`
	Acked     map[string]string    `json:"acked"`
	AckedAt   map[string]time.Time `json:"acked_at"`
	NACKs     []NACK               `json:"nacks,omitempty"`
}

type metrics struct {
	nacks     *prometheus.CounterVec
	acks      *prometheus.CounterVec
	streams   prometheus.Gauge
	publishes *prometheus.CounterVec
	reports   prometheus.Counter
	// rejected reports by reason; refused calls by method.
	reportsRejected *prometheus.CounterVec
	authFailures    *prometheus.CounterVec
}

// New builds a server; call Serve to run it.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil {
		return nil, errors.New("xds server: Config.Registry is required")
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	s := &Server{
		log:     lg,
		reports: cfg.Reports,
		nodes:   map[string]*nodeState{},
		streams: map[streamKey]*streamState{},
	}
	glog := gcplog.LoggerFuncs{
		DebugFunc: func(f string, a ...any) {},
		InfoFunc:  func(f string, a ...any) {},
		WarnFunc:  func(f string, a ...any) { lg.Warn("go-control-plane: " + fmt.Sprintf(f, a...)) },
		ErrorFunc: func(f string, a ...any) { lg.Error("go-control-plane: " + fmt.Sprintf(f, a...)) },
	}
	s.snap = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, glog)
	s.policy = cachev3.NewLinearCache(policyv1.TypeURL, cachev3.WithLogger(glog), cachev3.WithVersionPrefix(cfg.VersionPrefix))
	mux := &cachev3.MuxCache{
		Classify: func(r *cachev3.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string {
			return classify(r.GetTypeUrl())
		},
		Caches: map[string]cachev3.Cache{"envoy": parkNACKed{s.snap}, "policy": s.policy},
	}
	s.m = metrics{
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_xds_nacks_total",
			Help: "xDS updates a node rejected, by type."}, []string{"type"}),
		acks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_xds_acks_total",
			Help: "xDS updates a node accepted, by type."}, []string{"type"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "inferlb_xds_streams",
			Help: "Open xDS streams."}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_xds_publishes_total",
			Help: "Resource sets published, by what changed (cds, eds, policy)."}, []string{"what"}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_reports_total",
			Help: "Reports calls received from ext_proc instances."}),
		reportsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_reports_rejected_total",
			Help: "Reports refused as implausible or malformed (InvalidArgument), by reason."}, []string{"reason"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_xds_auth_failures_total",
			Help: "Calls and TLS handshakes refused for missing or wrong credentials, by gRPC method (tls-handshake for the handshake)."}, []string{"method"}),
	}
	for _, c := range []prometheus.Collector{s.m.nacks, s.m.acks, s.m.streams, s.m.publishes, s.m.reports, s.m.reportsRejected, s.m.authFailures} {
		if err := cfg.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("xds server metrics: %w", err)
		}
	}
	s.xds = serverv3.NewServer(context.Background(), mux, s.callbacks())
	a := cfg.Auth
	a.Reject = func(peer, method, reason string) {
		s.m.authFailures.WithLabelValues(method).Inc()
		lg.Warn("xds: unauthenticated call refused", "peer", peer, "method", method, "reason", reason)
		if cfg.Auth.Reject != nil {
			cfg.Auth.Reject(peer, method, reason)
		}
	}
	if a.Reloads == nil {
		var err error
		if a.Reloads, err = auth.NewReloads(cfg.Registry, lg); err != nil {
			return nil, fmt.Errorf("xds server: %w", err)
		}
	}
	authOpts, err := a.Options()
	if err != nil {
		return nil, fmt.Errorf("xds server: %w", err)
	}
	s.grpc = grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxConcurrentStreams(1 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		// Envoy's bootstrap pings its ADS connection every 2 s to find a
		// hung replica (envoy-configs); allow a ping a second.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	}, authOpts...)...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.grpc, s.xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(s.grpc, s.xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(s.grpc, s.xds)
	policyv1.RegisterReportsServer(s.grpc, s)
	return s, nil
}

func classify(typeURL string) string {
	if typeURL == policyv1.TypeURL {
		return "policy"
	}
	return "envoy"
}

// Serve serves gRPC on l until Stop; it returns nil after Stop.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Stop ends every stream and the listener. Streams are long-lived, so it
// does not wait for them to finish (Envoy reconnects and keeps its config).
func (s *Server) Stop() { s.grpc.Stop() }

// Publish sets a node's resources. The CDS and EDS of one node go in one
// snapshot (each node's EDS set equals its CDS's EDS clusters); the policy
// goes to the LinearCache only when it changed. Publishing what the server
// already holds does nothing, so a caller may publish every node every
// cycle.
func (s *Server) Publish(ctx context.Context, r *translate.Resources) error {
	snap := &cachev3.Snapshot{}
	cl := make([]types.Resource, 0, len(r.Clusters))
	for _, c := range r.Clusters {
		cl = append(cl, c)
	}
	ep := make([]types.Resource, 0, len(r.Endpoints))
	for _, e := range r.Endpoints {
		ep = append(ep, e)
	}
	// Envoy rejects a resource that breaks its proto constraints (a weight
	// of 0, an empty name) and keeps its old config, so the weights would
	// silently stop moving. Refuse it here, where the error names the field.
	for _, res := range slices.Concat(cl, ep) {
		if v, ok := res.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("publish %s: %s %q breaks Envoy's constraints: %w", r.NodeID, resourceKind(res), cachev3.GetResourceName(res), err)
			}
		}
	}
	snap.Resources[types.Cluster] = cachev3.NewResources(r.ClusterVersion, cl)
	snap.Resources[types.Endpoint] = cachev3.NewResources(r.EndpointVersion, ep)
	if err := snap.Consistent(); err != nil {
		return fmt.Errorf("publish %s: inconsistent snapshot: %w", r.NodeID, err)
	}
	s.mu.Lock()
	ns := s.node(r.NodeID)
	prev := ns.published
	s.mu.Unlock()
	policyVersion := ""
	if r.Policy != nil {
		policyVersion = r.Policy.Version
	}
	if prev.ClusterVersion == r.ClusterVersion && prev.EndpointVersion == r.EndpointVersion && prev.PolicyVersion == policyVersion {
		return nil // already held: nothing to send, and At keeps the time of the change
	}
	if prev.ClusterVersion != r.ClusterVersion || prev.EndpointVersion != r.EndpointVersion {
		if err := s.snap.SetSnapshot(ctx, r.NodeID, snap); err != nil {
			return fmt.Errorf("publish %s: %w", r.NodeID, err)
		}
		if prev.ClusterVersion != r.ClusterVersion {
			s.m.publishes.WithLabelValues("cds").Inc()
		}
		if prev.EndpointVersion != r.EndpointVersion {
			s.m.publishes.WithLabelValues("eds").Inc()
		}
	}
	if r.Policy != nil && prev.PolicyVersion != r.Policy.Version {
		if err := s.policy.UpdateResource(r.NodeID, r.Policy); err != nil {
			return fmt.Errorf("publish %s policy: %w", r.NodeID, err)
		}
		s.m.publishes.WithLabelValues("policy").Inc()
	}
	s.mu.Lock()
	ns.published = Published{ClusterVersion: r.ClusterVersion, EndpointVersion: r.EndpointVersion, At: time.Now()}
	if r.Policy != nil {
		ns.published.PolicyVersion = r.Policy.Version
	}
	s.mu.Unlock()
	return nil
}

// PolicyVersion is the RoutingPolicy version held for node ("" if none).
func (s *Server) PolicyVersion(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ns, ok := s.nodes[node]; ok {
		return ns.published.PolicyVersion
	}
	return ""
}

// Status returns every known node's status, sorted by node id.
func (s *Server) Status() []NodeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]NodeStatus, 0, len(s.nodes))
	for id, ns := range s.nodes {
		st := NodeStatus{NodeID: id, Streams: ns.streams, Published: ns.published,
			Acked: map[string]string{}, AckedAt: map[string]time.Time{}}
		for k, v := range ns.acked {
			st.Acked[shortType(k)] = v
		}
		for k, v := range ns.ackedAt {
			st.AckedAt[shortType(k)] = v
		}
		for _, n := range ns.nacks {
			st.NACKs = append(st.NACKs, *n)
		}
		slices.SortFunc(st.NACKs, func(a, b NACK) int { return strings.Compare(a.TypeURL, b.TypeURL) })
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b NodeStatus) int { return strings.Compare(a.NodeID, b.NodeID) })
	return out
}

func shortType(u string) string {
	switch u {
	case resourcev3.ClusterType:
		return "cds"
	case resourcev3.EndpointType:
		return "eds"
	case policyv1.TypeURL:
		return "policy"
	}
	return u
}

// node returns the state of id; s.mu held.
func (s *Server) node(id string) *nodeState {
	ns, ok := s.nodes[id]
	if !ok {
		ns = &nodeState{acked: map[string]string{}, ackedAt: map[string]time.Time{}, nacks: map[string]*NACK{}}
		s.nodes[id] = ns
	}
	return ns
}

// Report implements policyv1.ReportsServer.
func (s *Server) Report(ctx context.Context, req *policyv1.ReportRequest) (*policyv1.ReportResponse, error) {
	s.m.reports.Inc()
	if s.reports == nil {
		return nil, status.Error(codes.Unimplemented, "this control plane takes no reports")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "report: node_id is empty")
	}
	if err := s.reports.Report(ctx, req); err != nil {
		reason := "invalid"
		var re interface{ RejectReason() string }
		if errors.As(err, &re) {
			reason = re.RejectReason()
		}
		s.m.reportsRejected.WithLabelValues(reason).Inc()
		addr := ""
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		s.log.Warn("report rejected", "node", req.GetNodeId(), "instance", req.GetInstance(), "peer", addr,
			"reason", reason, "err", err.Error())
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &policyv1.ReportResponse{PolicyVersion: s.PolicyVersion(req.GetNodeId())}, nil
}

func (s *Server) callbacks() serverv3.Callbacks {
	open := func(delta bool) func(context.Context, int64, string) error {
		return func(_ context.Context, id int64, _ string) error {
			s.mu.Lock()
			s.streams[streamKey{delta, id}] = &streamState{sent: map[string]sentResponse{}}
			s.mu.Unlock()
			s.m.streams.Inc()
			return nil
		}
	}
	closed := func(delta bool) func(int64, *corev3.Node) {
		return func(id int64, _ *corev3.Node) {
			s.mu.Lock()
			k := streamKey{delta, id}
			if st, ok := s.streams[k]; ok && st.node != "" {
				s.node(st.node).streams--
			}
			delete(s.streams, k)
			s.mu.Unlock()
			s.m.streams.Dec()
		}
	}
	return serverv3.CallbackFuncs{
		StreamOpenFunc:        open(false),
		DeltaStreamOpenFunc:   open(true),
		StreamClosedFunc:      closed(false),
		DeltaStreamClosedFunc: closed(true),
		StreamRequestFunc: func(id int64, r *discoveryv3.DiscoveryRequest) error {
			s.onRequest(streamKey{false, id}, r.GetNode().GetId(), r.GetTypeUrl(), r.GetResponseNonce(), r.GetVersionInfo(), r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			s.onResponse(streamKey{false, id}, resp.GetTypeUrl(), resp.GetNonce(), resp.GetVersionInfo())
		},
		StreamDeltaRequestFunc: func(id int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			s.onRequest(streamKey{true, id}, r.GetNode().GetId(), r.GetTypeUrl(), r.GetResponseNonce(), "", r.GetErrorDetail().GetMessage(), r.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaResponseFunc: func(id int64, _ *discoveryv3.DeltaDiscoveryRequest, resp *discoveryv3.DeltaDiscoveryResponse) {
			s.onResponse(streamKey{true, id}, resp.GetTypeUrl(), resp.GetNonce(), resp.GetSystemVersionInfo())
		},
	}
}

func (s *Server) onResponse(k streamKey, typeURL, nonce, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.streams[k]; ok {
		st.sent[typeURL] = sentResponse{nonce: nonce, version: version}
	}
}

// onRequest records what a request says: the stream's node, and for a reply
// to one of our responses an ACK or a NACK.
func (s *Server) onRequest(k streamKey, nodeID, typeURL, nonce, version, errMsg string, nack bool) {
	s.mu.Lock()
	st, ok := s.streams[k]
	if !ok {
		s.mu.Unlock()
		return
	}
	if st.node == "" && nodeID != "" {
		st.node = nodeID
		s.node(nodeID).streams++
	}
	if st.node == "" || nonce == "" {
		s.mu.Unlock()
		return // initial request, not a reply
	}
	sentVersion, known := "", false
	if sr, ok := st.sent[typeURL]; ok && sr.nonce == nonce {
		sentVersion, known = sr.version, true
	}
	ns := s.node(st.node)
	node := st.node
	if nack {
		n := ns.nacks[typeURL]
		if n == nil {
			n = &NACK{TypeURL: typeURL}
			ns.nacks[typeURL] = n
		}
		n.Version, n.Message, n.At = sentVersion, errMsg, time.Now()
		n.Count++
		s.mu.Unlock()
		s.m.nacks.WithLabelValues(shortType(typeURL)).Inc()
		s.log.Warn("xds NACK", "node", node, "type", shortType(typeURL), "rejected_version", sentVersion, "error", errMsg)
		return
	}
	if !known {
		s.mu.Unlock()
		return // reply to a nonce we no longer track (superseded)
	}
	if version == "" {
		version = sentVersion // delta requests carry no version
	}
	ns.acked[typeURL] = version
	ns.ackedAt[typeURL] = time.Now()
	delete(st.sent, typeURL)
	s.mu.Unlock()
	s.m.acks.WithLabelValues(shortType(typeURL)).Inc()
}

// resourceKind names a resource's xDS type for an error message.
func resourceKind(res types.Resource) string {
	switch res.(type) {
	case *clusterv3.Cluster:
		return "cluster"
	case *endpointv3.ClusterLoadAssignment:
		return "load assignment"
	}
	return fmt.Sprintf("%T", res)
}
