// Package translate turns one frontend node's share of the fleet (the
// optimizer's weights, the control plane's view of engine health, the shed
// fractions) into the resources that node receives over xDS: one CDS cluster
// per eligibility class, one EDS ClusterLoadAssignment per such cluster, and
// the node's RoutingPolicy for its ext_proc services.
//
// Translation is pure: no clock, no I/O, deterministic output for equal input
// (golden-tested in translate_test.go; regenerate with
// `go test ./xds/translate -update`). Versions are content hashes, so a
// restarted control plane that computes the same weights produces the same
// versions and Envoy, which reconnects with its last version, is sent
// nothing new.
//
// Rules the translation keeps:
//   - Weights become integers ≥ 1 (EndpointWeights, the one home of this
//     rule; Resources.Weights returns the result for the admin view): an
//     engine's load_balancing_weight is round(share × WeightScale), at
//     least 1. Envoy rejects weight 0, so an eligible engine with no share
//     is placed at priority 1 (failover only) with weight 1. When no engine
//     of a class has a share (no demand yet), every engine is placed at
//     priority 0 with weight 1.
//   - The EDS health status is the control plane's view (HEALTHY, UNHEALTHY,
//     UNKNOWN for stale signals, DRAINING); Envoy's own active health checks
//     and outlier detection act on top of it.
//   - Each node's EDS set is exactly the EDS clusters of its CDS.
package translate

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"net"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Health is the control plane's view of an engine.
type Health int

const (
	// Healthy: fresh signals and a passing /health.
	Healthy Health = iota
	// Unhealthy: /health fails.
	Unhealthy
	// Unknown: signals are stale; the engine is neither known good nor bad.
	Unknown
	// Draining: the operator or the control plane takes it out gracefully.
	Draining
)

func (h Health) String() string {
	switch h {
	case Healthy:
		return "healthy"
	case Unhealthy:
		return "unhealthy"
	case Unknown:
		return "unknown"
	case Draining:
		return "draining"
	}
	return "health(" + strconv.Itoa(int(h)) + ")"
}

func (h Health) envoy() corev3.HealthStatus {
	switch h {
	case Healthy:
		return corev3.HealthStatus_HEALTHY
	case Unhealthy:
		return corev3.HealthStatus_UNHEALTHY
	case Draining:
		return corev3.HealthStatus_DRAINING
	}
	return corev3.HealthStatus_UNKNOWN
}

// LBPolicy is the consistent-hash load balancer of the class clusters.
type LBPolicy string

const (
	Maglev   LBPolicy = "maglev"
	RingHash LBPolicy = "ring_hash"
)

// Options are the cluster settings shared by every class cluster. Zero
// values are not defaults: start from DefaultOptions and change fields.
type Options struct {
	// ClusterPrefix names clusters: ClusterPrefix + class name.
	ClusterPrefix string
	LBPolicy      LBPolicy
	// MaglevTableSize must be a prime (Envoy rejects others); 65537 default.
	MaglevTableSize uint64
	// RingHash sizes (ring_hash only).
	RingMinSize, RingMaxSize uint64
	// HashBalanceFactor bounds a host's load to this percentage of the
	// average (consistent hashing with bounded loads); ≥ 100, 0 = off.
	// The default is 300: at lower factors a host with a few requests in
	// flight spills often enough that spills, and the returns after them,
	// are most of the follow-up turns that lose their cached engine, and
	// the slowest requests are mostly such turns prefilling a conversation
	// on a cold engine (TestDefaultBalanceFactorSpillsRarely; the figures
	// are in docs/decisions/hash-balance-factor.md). Load is balanced
	// by the optimizer's weights; the bound is only for a key far hotter
	// than its share.
	HashBalanceFactor uint32
	// WeightScale maps a share of 1.0 to this integer weight.
	WeightScale uint32
	// HealthyPanicThreshold in percent; 0 disables Envoy's panic mode so a
	// mostly-dead priority fails over instead of spraying dead engines.
	HealthyPanicThreshold float64
	ConnectTimeout        time.Duration

	HealthCheck HealthCheckOptions
	Outlier     OutlierOptions
	Circuit     CircuitOptions
}

// HealthCheckOptions configure Envoy's active HTTP health check.
type HealthCheckOptions struct {
	Path               string
	Interval, Timeout  time.Duration
	UnhealthyThreshold uint32
	HealthyThreshold   uint32
}

// OutlierOptions configure Envoy's outlier detection (hard failures; soft
// slowness is the control plane's penalty).
type OutlierOptions struct {
	Consecutive5xx            uint32
	ConsecutiveGatewayFailure uint32
	Interval                  time.Duration
	BaseEjectionTime          time.Duration
	MaxEjectionPercent        uint32
}

// CircuitOptions size the default-priority circuit breaker. LLM responses
// stream for tens of seconds, so concurrency limits are far above Envoy's
// defaults of 1024; the retry budget caps retries as a share of the active
// requests instead of a fixed count.
type CircuitOptions struct {
	MaxConnections      uint32
	MaxPendingRequests  uint32
	MaxRequests         uint32
	RetryBudgetPercent  float64
	MinRetryConcurrency uint32
}

// DefaultOptions are production settings.
func DefaultOptions() Options {
	return Options{
		ClusterPrefix:         "inferlb_",
		LBPolicy:              Maglev,
		MaglevTableSize:       65537,
		RingMinSize:           1024,
		RingMaxSize:           8 * 1024 * 1024,
		HashBalanceFactor:     300,
		WeightScale:           1000,
		HealthyPanicThreshold: 0,
		ConnectTimeout:        2 * time.Second,
		HealthCheck: HealthCheckOptions{
			Path: "/health", Interval: 2 * time.Second, Timeout: time.Second,
			UnhealthyThreshold: 2, HealthyThreshold: 2,
		},
		Outlier: OutlierOptions{
			Consecutive5xx: 5, ConsecutiveGatewayFailure: 3,
			Interval: 5 * time.Second, BaseEjectionTime: 15 * time.Second, MaxEjectionPercent: 50,
		},
		Circuit: CircuitOptions{
			MaxConnections: 100000, MaxPendingRequests: 10000, MaxRequests: 100000,
			RetryBudgetPercent: 10, MinRetryConcurrency: 3,
		},
	}
}

// Validate checks Options and names every bad field (the errors joined).
func (o Options) Validate() error {
	var errs []error
	bad := func(f string, v any, why string) { errs = append(errs, fmt.Errorf("%s: %s, got %v", f, why, v)) }
	if o.ClusterPrefix == "" {
		bad("cluster_prefix", `""`, "must not be empty")
	}
	switch o.LBPolicy {
	case Maglev:
		if !isPrime(o.MaglevTableSize) || o.MaglevTableSize > 5000011 {
			bad("maglev_table_size", o.MaglevTableSize, "must be a prime ≤ 5000011")
		}
	case RingHash:
		if o.RingMinSize == 0 || o.RingMaxSize < o.RingMinSize {
			bad("ring_min_size/ring_max_size", fmt.Sprintf("%d/%d", o.RingMinSize, o.RingMaxSize), "need 0 < min ≤ max")
		}
	default:
		bad("lb_policy", o.LBPolicy, `must be "maglev" or "ring_hash"`)
	}
	if o.HashBalanceFactor != 0 && o.HashBalanceFactor < 100 {
		bad("hash_balance_factor", o.HashBalanceFactor, "must be 0 (off) or ≥ 100")
	}
	if o.WeightScale < 10 || o.WeightScale > 1_000_000 {
		bad("weight_scale", o.WeightScale, "must be in [10, 1000000]")
	}
	if o.HealthyPanicThreshold < 0 || o.HealthyPanicThreshold > 100 {
		bad("healthy_panic_threshold", o.HealthyPanicThreshold, "must be a percentage in [0, 100]")
	}
	if o.ConnectTimeout <= 0 {
		bad("connect_timeout", o.ConnectTimeout, "must be positive")
	}
	hc := o.HealthCheck
	if hc.Path == "" || hc.Path[0] != '/' {
		bad("health_check.path", strconv.Quote(hc.Path), "must start with /")
	}
	if hc.Interval <= 0 || hc.Timeout <= 0 {
		bad("health_check.interval/timeout", fmt.Sprintf("%v/%v", hc.Interval, hc.Timeout), "must be positive")
	}
	if hc.UnhealthyThreshold == 0 || hc.HealthyThreshold == 0 {
		bad("health_check.unhealthy_threshold/healthy_threshold", fmt.Sprintf("%d/%d", hc.UnhealthyThreshold, hc.HealthyThreshold), "must be ≥ 1")
	}
	if o.Outlier.Interval <= 0 || o.Outlier.BaseEjectionTime <= 0 || o.Outlier.MaxEjectionPercent > 100 {
		bad("outlier", fmt.Sprintf("%+v", o.Outlier), "need positive interval and base ejection time, max ejection ≤ 100%")
	}
	if o.Circuit.RetryBudgetPercent < 0 || o.Circuit.RetryBudgetPercent > 100 {
		bad("circuit.retry_budget_percent", o.Circuit.RetryBudgetPercent, "must be in [0, 100]")
	}
	return errors.Join(errs...)
}

// isPrime is exact: ProbablyPrime(0) (Baillie-PSW) makes no mistakes
// below 2^64.
func isPrime(n uint64) bool { return new(big.Int).SetUint64(n).ProbablyPrime(0) }

// Engine is an engine as a node sees it.
type Engine struct {
	ID      string
	Address string // host:port, host an IP or a name
	Region  string
	Health  Health
	// HealthPath is the engine's health check path (fleet spec
	// engines[].health_path); "" means Options.HealthCheck.Path.
	HealthPath string
	// PrefillTokensPerS is the address's prefill rate (its profile's, times
	// its replicas; 0 unknown), which the routing policy carries to ext_proc.
	PrefillTokensPerS float64
	// Exclusive: no other node has a weight for the engine (policy
	// Endpoint.exclusive).
	Exclusive bool
}

// Class is one eligibility class at one node with its allocation.
type Class struct {
	Name             string
	Model            string
	Residency        string
	MinContextTokens uint32
	MaxContextTokens uint32
	// Weights is the node's share of this class per engine id; every
	// eligible engine appears (zero share allowed). Shares need not sum to 1.
	Weights map[string]float64
	// ShedByLevel is the fraction to shed per priority level.
	ShedByLevel         map[uint32]float64
	RetryBudgetFraction float64
	MaxRetries          uint32
	LocalInflightLimit  uint32
	Utilization         float64
	// MeanOutputTokens is the class's typical output length, for demand
	// reports of requests without max_tokens.
	MeanOutputTokens uint32
	// TokenizerSHA256 and ChatTemplateTokens are the model's context-bound
	// inputs for ext_proc (fleet spec models[].tokenizer's digest and
	// chat_template_tokens).
	TokenizerSHA256    string
	ChatTemplateTokens uint32
	// Affinity is the class's cache-affinity configuration and split
	// table (affinity.go); the zero value publishes none (ext_proc's
	// defaults).
	Affinity Affinity
	// HashBalanceFactor, when not 0, is the class cluster's bounded-load
	// factor in percent (≥ 100) instead of Options.HashBalanceFactor: the
	// control plane tightens it for a class whose traffic reuses no cache.
	// An endpoint picker keeps the policy's load balancer (Options').
	HashBalanceFactor uint32
}

// Priority is a traffic priority.
type Priority struct {
	Name  string
	Level uint32
}

// Node is everything translated for one frontend node.
type Node struct {
	NodeID string
	Region string
	// Classes the node routes; Engines holds every engine any class names.
	Classes         []Class
	Engines         map[string]Engine
	Priorities      []Priority
	DefaultPriority string
	// PolicyVersion and GeneratedAt stamp the RoutingPolicy (monotonic,
	// chosen by the caller).
	PolicyVersion string
	GeneratedAt   time.Time
}

// Resources are one node's xDS resources.
type Resources struct {
	NodeID    string
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Policy    *policyv1.RoutingPolicy
	// ClusterVersion and EndpointVersion hash the CDS and EDS content.
	ClusterVersion  string
	EndpointVersion string
	// PolicyHash hashes the policy without its version and timestamp, so a
	// caller can tell whether the decision changed.
	PolicyHash string
	// Weights is each class's EDS endpoints as translated: class name →
	// engine id → weight and priority (what the Endpoints say, for views
	// that show them without decoding EDS).
	Weights map[string]map[string]EndpointWeight
}

// EndpointWeight is an engine's place in its class's EDS assignment.
type EndpointWeight struct {
	Weight   uint32 `json:"weight"`
	Priority uint32 `json:"priority"`
}

// ClusterName is the Envoy cluster of class at every node.
func (o Options) ClusterName(class string) string { return o.ClusterPrefix + class }

// Translate builds one node's resources.
func Translate(n Node, o Options) (*Resources, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("translate options: %w", err)
	}
	if n.NodeID == "" {
		return nil, errors.New("translate: node id is empty")
	}
	classes := slices.Clone(n.Classes)
	slices.SortFunc(classes, func(a, b Class) int { return cmp.Compare(a.Name, b.Name) })
	out := &Resources{NodeID: n.NodeID, Weights: map[string]map[string]EndpointWeight{}}
	seen := map[string]bool{}
	for _, c := range classes {
		if c.Name == "" {
			return nil, fmt.Errorf("translate node %s: class with empty name", n.NodeID)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("translate node %s: class %q twice", n.NodeID, c.Name)
		}
		seen[c.Name] = true
		if err := checkClassPolicy(c); err != nil {
			return nil, fmt.Errorf("translate node %s class %s: %w", n.NodeID, c.Name, err)
		}
		if err := c.Affinity.check(); err != nil {
			return nil, fmt.Errorf("translate node %s class %s: affinity: %w", n.NodeID, c.Name, err)
		}
		name := o.ClusterName(c.Name)
		hc := clusterHealthPath(c, n.Engines, o)
		cla, ew, err := loadAssignment(name, c, n.Engines, hc, o)
		if err != nil {
			return nil, fmt.Errorf("translate node %s class %s: %w", n.NodeID, c.Name, err)
		}
		out.Weights[c.Name] = ew
		co := o
		if c.HashBalanceFactor != 0 {
			co.HashBalanceFactor = c.HashBalanceFactor
		}
		out.Clusters = append(out.Clusters, classCluster(name, hc, co))
		out.Endpoints = append(out.Endpoints, cla)
	}
	out.Policy = policy(n, classes, out.Weights, o)
	out.ClusterVersion = hashMessages(out.Clusters)
	out.EndpointVersion = hashMessages(out.Endpoints)
	bare := proto.Clone(out.Policy).(*policyv1.RoutingPolicy)
	bare.Version, bare.GeneratedAt = "", nil
	out.PolicyHash = hashMessages([]*policyv1.RoutingPolicy{bare})
	return out, nil
}

func hashMessages[M proto.Message](ms []M) string {
	h := sha256.New()
	opt := proto.MarshalOptions{Deterministic: true}
	for _, m := range ms {
		b, err := opt.Marshal(m)
		if err != nil {
			panic(fmt.Sprintf("translate: marshal %T: %v", m, err)) // our own messages always marshal
		}
		h.Write(strconv.AppendInt(nil, int64(len(b)), 10))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// clusterHealthPath is the path of the class cluster's active health check:
// the one most of its engines use (ties: the first in byte order). Envoy
// has one path per cluster; engines with another path (a class mixing vLLM
// and SGLang servers) are not actively checked by Envoy — loadAssignment
// marks them — and rely on the control plane's probe of their own path,
// which EDS health status carries.
func clusterHealthPath(c Class, engines map[string]Engine, o Options) string {
	count := map[string]int{}
	for id := range c.Weights {
		count[engineHealthPath(engines[id], o)]++
	}
	best, n := o.HealthCheck.Path, 0
	for _, p := range slices.Sorted(maps.Keys(count)) {
		if count[p] > n {
			best, n = p, count[p]
		}
	}
	return best
}

func engineHealthPath(e Engine, o Options) string {
	if e.HealthPath != "" {
		return e.HealthPath
	}
	return o.HealthCheck.Path
}

func classCluster(name, healthPath string, o Options) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ResourceApiVersion:    corev3.ApiVersion_V3,
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		}},
		ConnectTimeout: durationpb.New(o.ConnectTimeout),
		// An engine the control plane no longer publishes (removed from
		// the fleet) leaves Envoy with the EDS update. By default Envoy
		// keeps a removed host that still passes its active health check
		// (pending_dynamic_removal) at its old weight, where it would
		// keep getting traffic indefinitely.
		IgnoreHealthOnHostRemoval: true,
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{
			// Apply every EDS update at once: weights are already batched
			// per control cycle.
			UpdateMergeWindow:     durationpb.New(0),
			HealthyPanicThreshold: &typev3.Percent{Value: o.HealthyPanicThreshold},
		},
		HealthChecks: []*corev3.HealthCheck{{
			Timeout:            durationpb.New(o.HealthCheck.Timeout),
			Interval:           durationpb.New(o.HealthCheck.Interval),
			NoTrafficInterval:  durationpb.New(o.HealthCheck.Interval),
			UnhealthyThreshold: wrapperspb.UInt32(o.HealthCheck.UnhealthyThreshold),
			HealthyThreshold:   wrapperspb.UInt32(o.HealthCheck.HealthyThreshold),
			HealthChecker: &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{
				Path: healthPath,
			}},
		}},
		OutlierDetection: &clusterv3.OutlierDetection{
			Consecutive_5Xx:            wrapperspb.UInt32(o.Outlier.Consecutive5xx),
			ConsecutiveGatewayFailure:  wrapperspb.UInt32(o.Outlier.ConsecutiveGatewayFailure),
			EnforcingConsecutive_5Xx:   wrapperspb.UInt32(100),
			Interval:                   durationpb.New(o.Outlier.Interval),
			BaseEjectionTime:           durationpb.New(o.Outlier.BaseEjectionTime),
			MaxEjectionPercent:         wrapperspb.UInt32(o.Outlier.MaxEjectionPercent),
			SuccessRateMinimumHosts:    wrapperspb.UInt32(3),
			EnforcingSuccessRate:       wrapperspb.UInt32(0),
			EnforcingFailurePercentage: wrapperspb.UInt32(0),
		},
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			Priority:           corev3.RoutingPriority_DEFAULT,
			MaxConnections:     wrapperspb.UInt32(o.Circuit.MaxConnections),
			MaxPendingRequests: wrapperspb.UInt32(o.Circuit.MaxPendingRequests),
			MaxRequests:        wrapperspb.UInt32(o.Circuit.MaxRequests),
			RetryBudget: &clusterv3.CircuitBreakers_Thresholds_RetryBudget{
				BudgetPercent:       &typev3.Percent{Value: o.Circuit.RetryBudgetPercent},
				MinRetryConcurrency: wrapperspb.UInt32(o.Circuit.MinRetryConcurrency),
			},
		}}},
	}
	if o.HashBalanceFactor > 0 {
		c.CommonLbConfig.ConsistentHashingLbConfig = &clusterv3.Cluster_CommonLbConfig_ConsistentHashingLbConfig{
			HashBalanceFactor: wrapperspb.UInt32(o.HashBalanceFactor),
		}
	}
	switch o.LBPolicy {
	case Maglev:
		c.LbPolicy = clusterv3.Cluster_MAGLEV
		c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{
			TableSize: wrapperspb.UInt64(o.MaglevTableSize),
		}}
	case RingHash:
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{
			MinimumRingSize: wrapperspb.UInt64(o.RingMinSize),
			MaximumRingSize: wrapperspb.UInt64(o.RingMaxSize),
		}}
	}
	return c
}

// EndpointWeights places each engine of a class in its EDS assignment:
// weight round(share/sum × scale), at least 1, at priority 0 for a
// positive share; weight 1 at priority 1 (failover only: Envoy rejects
// weight 0) for no share; and when no engine has a share, weight 1 at
// priority 0 for all (spread evenly rather than fail over to nothing).
// Shares must be finite and ≥ 0 (Translate checks).
func EndpointWeights(shares map[string]float64, scale uint32) map[string]EndpointWeight {
	w := intWeights(shares, scale)
	anyShare := false
	for _, v := range w {
		anyShare = anyShare || v > 0
	}
	out := make(map[string]EndpointWeight, len(w))
	for id, v := range w {
		switch {
		case v > 0:
			out[id] = EndpointWeight{Weight: v}
		case anyShare:
			out[id] = EndpointWeight{Weight: 1, Priority: 1}
		default:
			out[id] = EndpointWeight{Weight: 1}
		}
	}
	return out
}

// intWeights converts shares to integers: round(share/sum × scale), at
// least 1 for a positive share, 0 for no share.
func intWeights(shares map[string]float64, scale uint32) map[string]uint32 {
	// Summed in key order: a float sum in map order differs in its last
	// digits from run to run, enough to round a share at x.5 either way
	// (and so to change the EDS version of equal input).
	sum := 0.0
	for _, id := range slices.Sorted(maps.Keys(shares)) {
		if s := shares[id]; s > 0 && !math.IsInf(s, 0) {
			sum += s
		}
	}
	out := make(map[string]uint32, len(shares))
	for id, s := range shares {
		if sum == 0 || !(s > 0) || math.IsInf(s, 0) {
			out[id] = 0
			continue
		}
		w := math.Round(s / sum * float64(scale))
		out[id] = uint32(max(w, 1))
	}
	return out
}

type lbKey struct {
	priority uint32
	region   string
}

func loadAssignment(name string, c Class, engines map[string]Engine, healthPath string, o Options) (*endpointv3.ClusterLoadAssignment, map[string]EndpointWeight, error) {
	ids := make([]string, 0, len(c.Weights))
	for id, s := range c.Weights {
		if s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			return nil, nil, fmt.Errorf("engine %s: share must be a finite number ≥ 0, got %v", id, s)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	w := EndpointWeights(c.Weights, o.WeightScale)
	groups := map[lbKey][]*endpointv3.LbEndpoint{}
	for _, id := range ids {
		e, ok := engines[id]
		if !ok {
			return nil, nil, fmt.Errorf("engine %s: has a weight but is not in the node's engine table", id)
		}
		host, port, err := splitAddress(e.Address)
		if err != nil {
			return nil, nil, fmt.Errorf("engine %s: %w", id, err)
		}
		prio, weight := w[id].Priority, w[id].Weight
		lb := &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Protocol: corev3.SocketAddress_TCP, Address: host,
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
				}}},
				Hostname: id,
			}},
			HealthStatus:        e.Health.envoy(),
			LoadBalancingWeight: wrapperspb.UInt32(weight),
		}
		if engineHealthPath(e, o) != healthPath {
			lb.GetEndpoint().HealthCheckConfig = &endpointv3.Endpoint_HealthCheckConfig{DisableActiveHealthCheck: true}
		}
		k := lbKey{prio, e.Region}
		groups[k] = append(groups[k], lb)
	}
	keys := make([]lbKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b lbKey) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(a.region, b.region))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, k := range keys {
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:    &corev3.Locality{Region: k.region},
			LbEndpoints: groups[k],
			Priority:    k.priority,
		})
	}
	return cla, w, nil
}

// fractionSlack absorbs a solver's rounding (a shed rate a hair above the
// demand it sheds); policy() clamps such a fraction into [0, 1].
const fractionSlack = 1e-9

// checkClassPolicy rejects policy numbers ext_proc could not apply as
// meant: a fraction outside [0, 1] or not a number would be clamped or
// misread there, far from the cause.
func checkClassPolicy(c Class) error {
	if c.HashBalanceFactor != 0 && c.HashBalanceFactor < 100 {
		return fmt.Errorf("hash_balance_factor %d: must be 0 (the options') or ≥ 100", c.HashBalanceFactor)
	}
	for _, l := range slices.Sorted(maps.Keys(c.ShedByLevel)) {
		if f := c.ShedByLevel[l]; !(f >= -fractionSlack && f <= 1+fractionSlack) {
			return fmt.Errorf("shed fraction of priority level %d must be in [0, 1], got %v", l, f)
		}
	}
	if !(c.RetryBudgetFraction >= 0 && c.RetryBudgetFraction <= 1) {
		return fmt.Errorf("retry budget fraction must be in [0, 1], got %v", c.RetryBudgetFraction)
	}
	if !(c.Utilization >= 0) || math.IsInf(c.Utilization, 0) {
		return fmt.Errorf("utilization must be a finite number ≥ 0, got %v", c.Utilization)
	}
	return nil
}

func splitAddress(a string) (string, uint32, error) {
	host, ps, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, fmt.Errorf("address %q: %w", a, err)
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 || host == "" {
		return "", 0, fmt.Errorf("address %q: want host:port with port 1-65535", a)
	}
	return host, uint32(p), nil
}

func policy(n Node, classes []Class, weights map[string]map[string]EndpointWeight, o Options) *policyv1.RoutingPolicy {
	p := &policyv1.RoutingPolicy{
		NodeId:          n.NodeID,
		Region:          n.Region,
		Version:         n.PolicyVersion,
		DefaultPriority: n.DefaultPriority,
		LoadBalancer:    loadBalancer(o),
	}
	if !n.GeneratedAt.IsZero() {
		p.GeneratedAt = timestamppb.New(n.GeneratedAt)
	}
	for _, c := range classes {
		shed := map[uint32]float64{}
		for l, f := range c.ShedByLevel {
			if f > 0 {
				shed[l] = min(f, 1)
			}
		}
		p.Classes = append(p.Classes, &policyv1.ClassPolicy{
			Name: c.Name, Cluster: o.ClusterName(c.Name), Model: c.Model, Residency: c.Residency,
			MinContextTokens: c.MinContextTokens, MaxContextTokens: c.MaxContextTokens,
			ShedFractionByLevel: shed, RetryBudgetFraction: c.RetryBudgetFraction, MaxRetries: c.MaxRetries,
			LocalInflightLimit: c.LocalInflightLimit, Utilization: c.Utilization, MeanOutputTokens: c.MeanOutputTokens,
			TokenizerSha256: c.TokenizerSHA256, ChatTemplateTokens: c.ChatTemplateTokens,
			Affinity:  c.Affinity.policy(),
			Endpoints: classEndpoints(n.Engines, weights[c.Name]),
		})
	}
	prios := slices.Clone(n.Priorities)
	slices.SortFunc(prios, func(a, b Priority) int { return cmp.Or(cmp.Compare(a.Level, b.Level), cmp.Compare(a.Name, b.Name)) })
	for _, pr := range prios {
		p.Priorities = append(p.Priorities, &policyv1.Priority{Name: pr.Name, Level: pr.Level})
	}
	ids := make([]string, 0, len(n.Engines))
	used := map[string]bool{}
	for _, c := range classes {
		for id := range c.Weights {
			used[id] = true
		}
	}
	for id := range n.Engines {
		if used[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		e := n.Engines[id]
		p.Engines = append(p.Engines, &policyv1.EngineRef{Id: id, Address: e.Address, Region: e.Region})
	}
	return p
}

// loadBalancer is the class clusters' load balancer (classCluster) as the
// policy carries it to an endpoint picker.
func loadBalancer(o Options) *policyv1.LoadBalancer {
	lb := &policyv1.LoadBalancer{
		MaglevTableSize: o.MaglevTableSize, RingMinSize: o.RingMinSize, RingMaxSize: o.RingMaxSize,
		HashBalanceFactor: o.HashBalanceFactor, HealthyPanicThreshold: o.HealthyPanicThreshold,
	}
	if o.LBPolicy == RingHash {
		lb.Policy = policyv1.LoadBalancer_RING_HASH
	}
	return lb
}

// classEndpoints lists a class's endpoints in the order of its EDS
// assignment (loadAssignment: by priority, then region, then engine id),
// with the weight, priority and health Envoy gets, so that an endpoint
// picker builds the same table Envoy builds (ring hash is sensitive to the
// order; Maglev is not).
func classEndpoints(engines map[string]Engine, w map[string]EndpointWeight) []*policyv1.Endpoint {
	ids := slices.Sorted(maps.Keys(w))
	slices.SortStableFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(w[a].Priority, w[b].Priority), cmp.Compare(engines[a].Region, engines[b].Region))
	})
	out := make([]*policyv1.Endpoint, 0, len(ids))
	for _, id := range ids {
		e := engines[id]
		hs := e.Health.envoy()
		out = append(out, &policyv1.Endpoint{EngineId: id, Address: e.Address, Weight: w[id].Weight, Priority: w[id].Priority,
			// Envoy routes to HEALTHY and UNKNOWN endpoints alike.
			Healthy:           hs == corev3.HealthStatus_HEALTHY || hs == corev3.HealthStatus_UNKNOWN,
			PrefillTokensPerS: e.PrefillTokensPerS, Exclusive: e.Exclusive})
	}
	return out
}
