// Package kube discovers a fleet's engines in Kubernetes, as an alternative
// to listing them in the fleet file: the pods an InferencePool
// (inference.networking.k8s.io/v1, the Gateway API Inference Extension's
// pool) selects, at the addresses and with the readiness their
// EndpointSlices give, each one's model, GPU type and region read from pod
// or node labels. The rest of the fleet (regions, network, models, latency
// profiles, classes, priorities, frontends) is a fleet spec without engines,
// kept in a ConfigMap. Every change of the pool, its pods, their slices,
// their nodes or the ConfigMap yields a new fleet spec for the control
// plane (controlplane.Runner.UpdateFleet), which keeps publishing EDS and
// the routing policy from it.
//
// docs/kubernetes.md describes the objects, the label keys and the RBAC the
// watches need.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/inferlb/inferlb/api/fleet"
)

// InferencePoolGVR is the InferencePool resource of the Gateway API
// Inference Extension, version 1.
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// The label keys read by default (Config.Labels). A pod's label wins over
// its node's.
const (
	// LabelModel names the model a pod serves (a model of the fleet spec).
	LabelModel = "inferlb.io/model"
	// LabelGPU names the GPU type (a profiles[].gpu of the fleet spec). On
	// nodes, NVIDIA's GPU feature discovery label is read too.
	LabelGPU = "inferlb.io/gpu"
	// LabelRegion names the region (a regions[].name). On nodes, the
	// well-known topology label is read too.
	LabelRegion = "inferlb.io/region"
	// LabelServer is the model server kind (vllm, sglang, generic); default
	// vllm.
	LabelServer = "inferlb.io/server"
	// NodeLabelGPU and NodeLabelRegion are the node labels read after the
	// inferlb ones.
	NodeLabelGPU    = "nvidia.com/gpu.product"
	NodeLabelRegion = "topology.kubernetes.io/region"
	// DefaultConfigMapKey is the ConfigMap key holding the fleet spec.
	DefaultConfigMapKey = "fleet.yaml"
)

// Labels are the label keys an engine's attributes are read from: each
// list is tried in order, first on the pod, then on its node.
type Labels struct {
	Model, GPU, Region, Server []string
}

// DefaultLabels are the documented keys.
func DefaultLabels() Labels {
	return Labels{Model: []string{LabelModel}, GPU: []string{LabelGPU, NodeLabelGPU},
		Region: []string{LabelRegion, NodeLabelRegion}, Server: []string{LabelServer}}
}

// Config configures discovery.
type Config struct {
	// Namespace and Pool name the InferencePool; the pods, slices and the
	// ConfigMap are read in the same namespace.
	Namespace, Pool string
	// ConfigMap names the ConfigMap whose key ConfigMapKey (default
	// fleet.yaml) holds the fleet spec without engines.
	ConfigMap, ConfigMapKey string
	// Labels are the keys read (zero: DefaultLabels).
	Labels Labels
	// Logger; nil: slog.Default.
	Logger *slog.Logger
}

// ParsePool splits "namespace/name".
func ParsePool(s string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(s, "/")
	if !ok || ns == "" || n == "" || strings.Contains(n, "/") {
		return "", "", fmt.Errorf("inference pool %q: want namespace/name", s)
	}
	return ns, n, nil
}

// Discovery watches one InferencePool. Build it with New; Run it.
type Discovery struct {
	cfg Config
	log *slog.Logger

	factory informers.SharedInformerFactory
	nodes   informers.SharedInformerFactory
	dyn     dynamicinformer.DynamicSharedInformerFactory
	pools   cache.GenericLister
	pods    cache.Indexer
	slices  cache.Indexer
	cms     cache.Indexer
	nodeIx  cache.Indexer

	changed chan struct{}

	mu   sync.Mutex
	last string // the last spec handed out, as YAML: unchanged ones are not
}

// New builds the watches (nothing runs until Run).
func New(client kubernetes.Interface, dyn dynamic.Interface, cfg Config) (*Discovery, error) {
	if cfg.Namespace == "" || cfg.Pool == "" {
		return nil, errors.New("kubernetes discovery: the inference pool's namespace and name are required")
	}
	if cfg.ConfigMap == "" {
		return nil, errors.New("kubernetes discovery: the ConfigMap holding the fleet spec (without engines) is required")
	}
	if cfg.ConfigMapKey == "" {
		cfg.ConfigMapKey = DefaultConfigMapKey
	}
	if len(cfg.Labels.Model)+len(cfg.Labels.GPU)+len(cfg.Labels.Region)+len(cfg.Labels.Server) == 0 {
		cfg.Labels = DefaultLabels()
	}
	if len(cfg.Labels.Model) == 0 || len(cfg.Labels.GPU) == 0 || len(cfg.Labels.Region) == 0 {
		return nil, errors.New("kubernetes discovery: model, GPU and region label keys are required")
	}
	d := &Discovery{cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1)}
	if d.log == nil {
		d.log = slog.Default()
	}
	d.log = d.log.With("pool", cfg.Namespace+"/"+cfg.Pool)
	// Resync 0: every change arrives as an event; a periodic resync would
	// only rebuild the same spec.
	d.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(cfg.Namespace))
	d.nodes = informers.NewSharedInformerFactory(client, 0)
	d.dyn = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, cfg.Namespace, nil)
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.kick() },
		UpdateFunc: func(any, any) { d.kick() },
		DeleteFunc: func(any) { d.kick() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		d.factory.Core().V1().Pods().Informer(),
		d.factory.Discovery().V1().EndpointSlices().Informer(),
		d.factory.Core().V1().ConfigMaps().Informer(),
		d.nodes.Core().V1().Nodes().Informer(),
		d.dyn.ForResource(InferencePoolGVR).Informer(),
	} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
	}
	d.pods = d.factory.Core().V1().Pods().Informer().GetIndexer()
	d.slices = d.factory.Discovery().V1().EndpointSlices().Informer().GetIndexer()
	d.cms = d.factory.Core().V1().ConfigMaps().Informer().GetIndexer()
	d.nodeIx = d.nodes.Core().V1().Nodes().Informer().GetIndexer()
	d.pools = d.dyn.ForResource(InferencePoolGVR).Lister()
	return d, nil
}

func (d *Discovery) kick() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// Run starts the watches, waits for their first lists, and then calls
// publish with every new fleet spec (one that differs from the last one
// handed out) until ctx ends. A state that makes no valid spec (no pool
// yet, no ready engine, a bad ConfigMap) is logged and nothing is
// published: the control plane keeps the last fleet. publish runs on Run's
// goroutine, one call at a time. Run returns when ctx ends (nil), or an
// error if the first lists do not complete.
func (d *Discovery) Run(ctx context.Context, publish func(*fleet.Spec)) error {
	d.factory.Start(ctx.Done())
	d.nodes.Start(ctx.Done())
	d.dyn.Start(ctx.Done())
	defer func() {
		d.factory.Shutdown()
		d.nodes.Shutdown()
		d.dyn.Shutdown()
	}()
	// A watch the service account may not list never syncs, and client-go
	// only logs its refusals: say what to check.
	slow := time.AfterFunc(15*time.Second, func() {
		d.log.Warn("kubernetes discovery: watches not synced after 15s; check the service account's RBAC (get/list/watch on inferencepools, pods, configmaps, endpointslices, nodes) and the API server")
	})
	defer slow.Stop()
	for typ, ok := range d.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return d.syncErr(ctx, typ.String())
		}
	}
	for typ, ok := range d.nodes.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return d.syncErr(ctx, typ.String())
		}
	}
	for gvr, ok := range d.dyn.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return d.syncErr(ctx, gvr.String())
		}
	}
	slow.Stop()
	d.log.Info("kubernetes discovery: watches synced")
	d.kick()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.changed:
		}
		spec, skipped, err := d.Build()
		for _, s := range skipped {
			d.log.Warn("kubernetes discovery: endpoint left out", "why", s)
		}
		if err != nil {
			if err.Error() != lastErr {
				d.log.Error("kubernetes discovery: no fleet from the cluster's state; the control plane keeps the last one", "err", err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		// The whole spec is the key: a ConfigMap edit (a profile's numbers)
		// is a new fleet as much as a pod is.
		key, _ := yaml.Marshal(spec)
		d.mu.Lock()
		same := d.last == string(key)
		d.last = string(key)
		d.mu.Unlock()
		if same {
			continue
		}
		d.log.Info("kubernetes discovery: fleet", "engines", len(spec.Engines))
		publish(spec)
	}
}

func (d *Discovery) syncErr(ctx context.Context, what string) error {
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("kubernetes discovery: the watch of %s did not sync", what)
}

// Build makes the fleet spec from the watches' current state: the
// ConfigMap's spec with one engine per ready endpoint of a pod the pool
// selects. skipped explains each endpoint left out (not ready, missing or
// unknown labels); err is why no spec could be made.
func (d *Discovery) Build() (spec *fleet.Spec, skipped []string, err error) {
	obj, err := d.pools.ByNamespace(d.cfg.Namespace).Get(d.cfg.Pool)
	if err != nil {
		return nil, nil, fmt.Errorf("inference pool %s/%s: %w", d.cfg.Namespace, d.cfg.Pool, err)
	}
	pool, err := parsePool(obj.(*unstructured.Unstructured))
	if err != nil {
		return nil, nil, err
	}
	cmObj, ok, _ := d.cms.GetByKey(d.cfg.Namespace + "/" + d.cfg.ConfigMap)
	if !ok {
		return nil, nil, fmt.Errorf("configmap %s/%s not found", d.cfg.Namespace, d.cfg.ConfigMap)
	}
	doc, ok := cmObj.(*corev1.ConfigMap).Data[d.cfg.ConfigMapKey]
	if !ok {
		return nil, nil, fmt.Errorf("configmap %s/%s has no key %q", d.cfg.Namespace, d.cfg.ConfigMap, d.cfg.ConfigMapKey)
	}
	base, err := parseBase([]byte(doc))
	if err != nil {
		return nil, nil, fmt.Errorf("configmap %s/%s key %s: %w", d.cfg.Namespace, d.cfg.ConfigMap, d.cfg.ConfigMapKey, err)
	}
	var eps []endpoint
	for _, o := range d.slices.List() {
		eps = append(eps, endpointsOf(o.(*discoveryv1.EndpointSlice))...)
	}
	engines, skipped := d.engines(pool, eps, base)
	if len(engines) == 0 {
		return nil, skipped, fmt.Errorf("inference pool %s/%s: no ready endpoint of a selected pod with a known model, GPU and region", d.cfg.Namespace, d.cfg.Pool)
	}
	spec, err = base.with(engines)
	if err != nil {
		return nil, skipped, fmt.Errorf("fleet spec from configmap %s/%s and the pool's endpoints: %w", d.cfg.Namespace, d.cfg.ConfigMap, err)
	}
	return spec, skipped, nil
}

// pool is what discovery reads of an InferencePool.
type pool struct {
	selector labels.Selector
	port     int
}

func parsePool(u *unstructured.Unstructured) (pool, error) {
	name := u.GetNamespace() + "/" + u.GetName()
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || !found || len(ml) == 0 {
		return pool{}, fmt.Errorf("inference pool %s: spec.selector.matchLabels is missing or not a map of strings", name)
	}
	ports, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil || !found || len(ports) == 0 {
		return pool{}, fmt.Errorf("inference pool %s: spec.targetPorts is missing", name)
	}
	pm, _ := ports[0].(map[string]any)
	n, found, err := unstructured.NestedInt64(pm, "number")
	if err != nil || !found || n < 1 || n > 65535 {
		return pool{}, fmt.Errorf("inference pool %s: spec.targetPorts[0].number must be a port 1-65535", name)
	}
	return pool{selector: labels.SelectorFromSet(ml), port: int(n)}, nil
}

// endpoint is one address of an EndpointSlice that points to a pod.
type endpoint struct {
	slice, pod, node, address string
	ready                     bool
}

func endpointsOf(s *discoveryv1.EndpointSlice) []endpoint {
	var out []endpoint
	for _, e := range s.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || len(e.Addresses) == 0 {
			continue
		}
		if e.TargetRef.Namespace != "" && e.TargetRef.Namespace != s.Namespace {
			continue
		}
		// The API: a nil ready condition means ready.
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		node := ""
		if e.NodeName != nil {
			node = *e.NodeName
		}
		// One address per endpoint is the API's rule (the field is a list
		// for history); the first is the one consumers use.
		out = append(out, endpoint{slice: s.Name, pod: e.TargetRef.Name, node: node, address: e.Addresses[0], ready: ready})
	}
	return out
}

// engines turns the ready endpoints of the pool's pods into fleet engines,
// one per pod (a pod in several slices, e.g. behind two Services, is one
// engine: ready if any slice says so), sorted by id.
func (d *Discovery) engines(p pool, eps []endpoint, base *baseSpec) ([]fleet.Engine, []string) {
	type cand struct {
		ep    endpoint
		ready bool
	}
	byPod := map[string]*cand{}
	for _, ep := range eps {
		c, ok := byPod[ep.pod]
		if !ok {
			byPod[ep.pod] = &cand{ep: ep, ready: ep.ready}
			continue
		}
		if ep.ready && !c.ready {
			c.ep, c.ready = ep, true
		}
	}
	var out []fleet.Engine
	var skipped []string
	for _, name := range slices.Sorted(maps.Keys(byPod)) {
		c := byPod[name]
		o, ok, _ := d.pods.GetByKey(d.cfg.Namespace + "/" + name)
		if !ok {
			continue // not (yet) seen, or gone: the slice lags the pod
		}
		pod := o.(*corev1.Pod)
		if !p.selector.Matches(labels.Set(pod.Labels)) {
			continue // a pod of another pool, or of none
		}
		if !c.ready {
			skipped = append(skipped, fmt.Sprintf("pod %s: not ready in EndpointSlice %s", name, c.ep.slice))
			continue
		}
		nodeName := c.ep.node
		if nodeName == "" {
			nodeName = pod.Spec.NodeName
		}
		var nodeLabels map[string]string
		if nodeName != "" {
			if no, ok, _ := d.nodeIx.GetByKey(nodeName); ok {
				nodeLabels = no.(*corev1.Node).Labels
			}
		}
		get := func(keys []string) string {
			for _, src := range []map[string]string{pod.Labels, nodeLabels} {
				for _, k := range keys {
					if v := src[k]; v != "" {
						return v
					}
				}
			}
			return ""
		}
		e := fleet.Engine{ID: name, Address: net.JoinHostPort(c.ep.address, strconv.Itoa(p.port)), Replicas: 1,
			Model: get(d.cfg.Labels.Model), GPU: get(d.cfg.Labels.GPU), Region: get(d.cfg.Labels.Region), Server: get(d.cfg.Labels.Server)}
		if why := base.refuses(e, d.cfg.Labels); why != "" {
			skipped = append(skipped, fmt.Sprintf("pod %s: %s", name, why))
			continue
		}
		out = append(out, e)
	}
	return out, skipped
}

// baseSpec is the ConfigMap's fleet spec without engines: its YAML (to add
// engines to and parse as a whole) and what an engine must match.
type baseSpec struct {
	doc      map[string]any
	regions  map[string]bool
	profiles map[[2]string]bool
	models   map[string]bool
}

func parseBase(data []byte) (*baseSpec, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, errors.New("empty fleet spec")
	}
	if _, ok := doc["engines"]; ok {
		return nil, errors.New("engines: the fleet spec for Kubernetes discovery lists no engines (the InferencePool's pods are the engines)")
	}
	// The light view: what an engine must name. Parse checks the rest.
	var light struct {
		Regions  []struct{ Name string }
		Models   []struct{ Name string }
		Profiles []struct{ GPU, Model string }
	}
	if err := yaml.Unmarshal(data, &light); err != nil {
		return nil, err
	}
	b := &baseSpec{doc: doc, regions: map[string]bool{}, profiles: map[[2]string]bool{}, models: map[string]bool{}}
	for _, r := range light.Regions {
		b.regions[r.Name] = true
	}
	for _, m := range light.Models {
		b.models[m.Name] = true
	}
	for _, p := range light.Profiles {
		b.profiles[[2]string{p.GPU, p.Model}] = true
	}
	return b, nil
}

// refuses says why an engine cannot join the spec ("" if it can): a
// missing label, or a name the spec does not know.
func (b *baseSpec) refuses(e fleet.Engine, l Labels) string {
	switch {
	case e.Model == "":
		return fmt.Sprintf("no model label (%s)", strings.Join(l.Model, ", "))
	case e.GPU == "":
		return fmt.Sprintf("no GPU label (%s) on the pod or its node", strings.Join(l.GPU, ", "))
	case e.Region == "":
		return fmt.Sprintf("no region label (%s) on the pod or its node", strings.Join(l.Region, ", "))
	case !b.models[e.Model]:
		return fmt.Sprintf("model %q is not a model of the fleet spec", e.Model)
	case !b.regions[e.Region]:
		return fmt.Sprintf("region %q is not a region of the fleet spec", e.Region)
	case !b.profiles[[2]string{e.GPU, e.Model}]:
		return fmt.Sprintf("no profile for gpu %q model %q in the fleet spec", e.GPU, e.Model)
	}
	return ""
}

// with is the whole spec: the base with the engines, parsed (defaults,
// validation, normalization) like a fleet file.
func (b *baseSpec) with(engines []fleet.Engine) (*fleet.Spec, error) {
	doc := maps.Clone(b.doc)
	list := make([]map[string]any, 0, len(engines))
	for _, e := range engines {
		m := map[string]any{"id": e.ID, "address": e.Address, "region": e.Region, "gpu": e.GPU, "model": e.Model, "replicas": 1}
		if e.Server != "" {
			m["server"] = e.Server
		}
		list = append(list, m)
	}
	doc["engines"] = list
	data, err := yaml.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return fleet.Parse(data)
}

// WaitFirst runs d until the first fleet spec, and returns it with a
// channel of the later ones (closed when ctx ends or Run fails; Err then
// says why). It gives up after timeout.
func (d *Discovery) WaitFirst(ctx context.Context, timeout time.Duration) (*fleet.Spec, <-chan *fleet.Spec, func() error, error) {
	first := make(chan *fleet.Spec, 1)
	later := make(chan *fleet.Spec, 1)
	var runErr error
	done := make(chan struct{})
	got := false
	go func() {
		defer close(done)
		defer close(later)
		runErr = d.Run(ctx, func(s *fleet.Spec) {
			if !got {
				got = true
				first <- s
				return
			}
			// Only the newest matters: drop an unread older one.
			select {
			case <-later:
			default:
			}
			later <- s
		})
	}()
	errf := func() error { <-done; return runErr }
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s := <-first:
		return s, later, errf, nil
	case <-done:
		if runErr != nil {
			return nil, nil, errf, runErr
		}
		return nil, nil, errf, ctx.Err()
	case <-t.C:
		return nil, nil, errf, fmt.Errorf("kubernetes discovery: no fleet within %v (is the pool there, with ready pods, and the ConfigMap?)", timeout)
	}
}
