// Package cpclient is the ext_proc service's side of the control plane
// contract: a RoutingPolicy subscription over ADS (state of the world) and a
// Reports client that sends demand and engine evidence about once a second.
package cpclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Subscriber keeps a node's RoutingPolicy current. It ACKs a policy Apply
// accepted and NACKs (with the error) one it rejected; on a lost stream it
// keeps the last policy (it never calls Apply with nothing) and reconnects
// with jittered exponential backoff.
type Subscriber struct {
	// Conn is the connection to the control plane's ADS server.
	Conn grpc.ClientConnInterface
	// NodeID is the frontend node (the resource name); Region its locality.
	NodeID, Region string
	// Apply installs a policy; an error NACKs it.
	Apply func(*policyv1.RoutingPolicy) error
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound reconnection delays (default 100 ms, 5 s).
	MinBackoff, MaxBackoff time.Duration

	connected atomic.Bool
	acked     atomic.Value // string: last ACKed version
}

// Connected reports whether a stream is currently open and has received a response.
func (s *Subscriber) Connected() bool { return s.connected.Load() }

// Version returns the last ACKed version ("" before the first).
func (s *Subscriber) Version() string {
	v, _ := s.acked.Load().(string)
	return v
}

// Run subscribes until ctx is cancelled.
func (s *Subscriber) Run(ctx context.Context) error {
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	minB, maxB := s.MinBackoff, s.MaxBackoff
	if minB <= 0 {
		minB = 100 * time.Millisecond
	}
	if maxB < minB {
		maxB = max(5*time.Second, minB)
	}
	backoff := minB
	for {
		got, err := s.stream(ctx)
		s.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			backoff = minB
		}
		s.Logger.Warn("policy subscription lost; keeping the last policy", "err", err, "retry_in", backoff)
		d := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
		backoff = min(backoff*2, maxB)
	}
}

// stream runs one ADS stream; got reports whether any response arrived.
func (s *Subscriber) stream(ctx context.Context) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(s.Conn)
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: s.NodeID, Cluster: s.NodeID}
	if s.Region != "" {
		node.Locality = &corev3.Locality{Region: s.Region}
	}
	// An empty version on a new stream: whatever the server holds is sent,
	// even if a restarted control plane reuses a version string.
	req := &discoveryv3.DiscoveryRequest{
		Node: node, TypeUrl: policyv1.TypeURL, ResourceNames: []string{s.NodeID},
	}
	if err := st.Send(req); err != nil {
		return false, err
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			return got, err
		}
		got = true
		s.connected.Store(true)
		if resp.GetTypeUrl() != policyv1.TypeURL {
			continue // not ours on this stream
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: policyv1.TypeURL, ResourceNames: []string{s.NodeID}, ResponseNonce: resp.GetNonce()}
		if aerr := s.apply(resp); aerr != nil {
			s.Logger.Error("routing policy rejected (NACK)", "version", resp.GetVersionInfo(), "err", aerr)
			ack.VersionInfo = s.Version()
			ack.ErrorDetail = &statuspb.Status{Code: int32(codes.InvalidArgument), Message: aerr.Error()}
		} else {
			ack.VersionInfo = resp.GetVersionInfo()
			s.acked.Store(resp.GetVersionInfo())
		}
		if err := st.Send(ack); err != nil {
			return got, err
		}
	}
}

var errNoPolicy = errors.New("response holds no RoutingPolicy for this node")

func (s *Subscriber) apply(resp *discoveryv3.DiscoveryResponse) error {
	var found *policyv1.RoutingPolicy
	for _, a := range resp.GetResources() {
		if a.GetTypeUrl() != policyv1.TypeURL {
			return fmt.Errorf("resource of type %q in a %s response", a.GetTypeUrl(), policyv1.TypeURL)
		}
		p := &policyv1.RoutingPolicy{}
		if err := a.UnmarshalTo(p); err != nil {
			return fmt.Errorf("unpack RoutingPolicy: %w", err)
		}
		if p.GetNodeId() != "" && p.GetNodeId() != s.NodeID {
			continue
		}
		found = p
	}
	if found == nil {
		if len(resp.GetResources()) == 0 {
			// The control plane has no policy for us (yet, or it was
			// removed): keep the one in force.
			s.Logger.Warn("control plane sent no RoutingPolicy for this node; keeping the last one", "node", s.NodeID)
			return nil
		}
		return errNoPolicy
	}
	return s.Apply(found)
}
