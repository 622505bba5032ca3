package kube_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/discovery/kube"
	"github.com/inferlb/inferlb/internal/k8stest"
	"github.com/inferlb/inferlb/tools/enginesim"
)

// The fleet without engines, as an operator keeps it in a ConfigMap: one
// region, one model on H100s, one class, one priority, one frontend.
const baseFleet = `name: k8s
regions: [{name: local}]
frontends: [{name: fe, region: local}]
models: [{name: llama-3.1-8b, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: llama-3.1-8b, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5,
     decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000, max_context_tokens: 8192}
classes: [{name: chat, model: llama-3.1-8b, mean_prompt_tokens: 200, mean_output_tokens: 200}]
priorities: [{name: default, level: 0, shed_cost: 1}]
`

const ns = "llm"

// TestKubernetesDiscoveryFollowsThePool runs the control plane with
// Kubernetes discovery against a real etcd and kube-apiserver: an
// InferencePool selecting vLLM pods (engine simulators on loopback), their
// EndpointSlice, the fleet's ConfigMap. The EDS the control plane serves
// over ADS must follow a scale-up, a pod turning not ready and a
// scale-down, each within one control cycle (--interval) of the API
// write.
func TestKubernetesDiscoveryFollowsThePool(t *testing.T) {
	defer leaktest.AfterTest(t)()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := k8stest.Start(t)
	defer c.Stop()
	cs, dyn, err := c.Clients()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile("../../../deploy/crds/inferencepools.inference.networking.k8s.io.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, crd); err != nil {
		t.Fatal(err)
	}

	// Engines: one port on several loopback addresses, as pods share
	// their pool's target port on their own IPs. (EndpointSlice
	// validation refuses loopback IPs, so the slice lists them as FQDN
	// addresses: "127.0.0.2" is a valid name, dialled as it is.)
	port, hosts := freePortOn(t, "127.0.0.2", "127.0.0.3", "127.0.0.4")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, h := range hosts {
		prof := enginesim.H100Llama8B
		s, err := enginesim.Start(ctx, enginesim.Options{ID: h, Listen: net.JoinHostPort(h, strconv.Itoa(port)),
			Model: prof.Model, Profile: prof, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}

	manifest := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-1
  labels: {topology.kubernetes.io/region: local, nvidia.com/gpu.product: H100}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: inferlb-fleet, namespace: %[1]s}
data:
  fleet.yaml: |
%[2]s
---
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: llama, namespace: %[1]s}
spec:
  selector: {matchLabels: {app: vllm-llama}}
  targetPorts: [{number: %[3]d}]
  endpointPickerRef: {name: inferlb-epp, port: {number: 9002}}
`, ns, indent(baseFleet, "    "), port)
	if _, err := c.Apply(ctx, []byte(manifest)); err != nil {
		t.Fatal(err)
	}
	// Two pods at first, and one of another pool on the same slice's
	// Service, which must never show.
	for _, p := range []struct{ name, app string }{{"vllm-a", "vllm-llama"}, {"vllm-b", "vllm-llama"}, {"other", "something-else"}} {
		createPod(ctx, t, cs, p.name, p.app)
	}
	ready := map[string]bool{"vllm-a": true, "vllm-b": true, "other": true}
	addr := map[string]string{"vllm-a": hosts[0], "vllm-b": hosts[1], "vllm-c": hosts[2], "other": hosts[2]}
	setSlice(ctx, t, cs, port, []string{"vllm-a", "vllm-b", "other"}, ready, addr)

	disc, err := kube.New(cs, dyn, kube.Config{Namespace: ns, Pool: "llama", ConfigMap: "inferlb-fleet", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg := controlplane.DefaultRunConfig()
	cfg.XDSListen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Interval, cfg.ScrapeInterval, cfg.Warmup, cfg.DemandWindow = 3*time.Second, 200*time.Millisecond, 0, time.Second
	cfg.Logger = quiet
	runners := make(chan *controlplane.Runner, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- kube.ServeControlPlane(runCtx, disc, cfg, kube.ServeOptions{FirstFleet: time.Minute,
			Started: func(r *controlplane.Runner) { runners <- r }})
	}()
	defer func() {
		stopRun()
		if err := <-served; err != nil {
			t.Errorf("control plane: %v", err)
		}
	}()
	var r *controlplane.Runner
	select {
	case r = <-runners:
	case err := <-served:
		t.Fatalf("control plane ended before it started: %v", err)
	}
	xdsAddr, _, err := r.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eds := watchEDS(ctx, t, xdsAddr, "fe", "inferlb_chat")
	defer eds.stop()

	hp := func(h string) string { return net.JoinHostPort(h, strconv.Itoa(port)) }
	// The first fleet: warm-up, a scrape round and the first cycle.
	eds.await(t, time.Minute, []string{hp(hosts[0]), hp(hosts[1])})

	// Each change must show within one control cycle of the write.
	within := cfg.Interval
	step := func(what string, write func(), want ...string) {
		t.Helper()
		start := time.Now()
		write()
		eds.await(t, within, want)
		t.Logf("%s: EDS followed in %v (one cycle: %v)", what, time.Since(start).Round(time.Millisecond), within)
	}
	step("scale-up", func() {
		createPod(ctx, t, cs, "vllm-c", "vllm-llama")
		setSlice(ctx, t, cs, port, []string{"vllm-a", "vllm-b", "vllm-c"}, map[string]bool{"vllm-a": true, "vllm-b": true, "vllm-c": true}, addr)
	}, hp(hosts[0]), hp(hosts[1]), hp(hosts[2]))
	step("not ready", func() {
		setSlice(ctx, t, cs, port, []string{"vllm-a", "vllm-b", "vllm-c"}, map[string]bool{"vllm-a": true, "vllm-b": false, "vllm-c": true}, addr)
	}, hp(hosts[0]), hp(hosts[2]))
	step("scale-down", func() {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "vllm-c", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		setSlice(ctx, t, cs, port, []string{"vllm-a", "vllm-b"}, map[string]bool{"vllm-a": true, "vllm-b": false}, addr)
	}, hp(hosts[0]))
	if got := len(r.Fleet().Engines); got != 1 {
		t.Errorf("the control plane plans for %d engines, want 1", got)
	}

	// A profile edited in the ConfigMap is a new fleet too.
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "inferlb-fleet", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["fleet.yaml"] = strings.Replace(cm.Data["fleet.yaml"], "decode_step_ms: 6.5", "decode_step_ms: 7.5", 1)
	start := time.Now()
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k8stest.Poll(ctx, within, 10*time.Millisecond, func() error {
		if got := r.Fleet().Profiles[0].DecodeStepMs; got != 7.5 {
			return fmt.Errorf("the control plane's profile has decode_step_ms %v, want 7.5 from the ConfigMap", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("profile edit: the control plane took it in %v", time.Since(start).Round(time.Millisecond))
}

func indent(s, pre string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = pre + lines[i]
	}
	return strings.Join(lines, "\n")
}

// freePortOn finds a TCP port free on every one of the loopback hosts.
func freePortOn(t *testing.T, hosts ...string) (int, []string) {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", hosts[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for _, h := range hosts[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return port, hosts
		}
	}
	t.Fatal("no port free on every loopback host")
	return 0, nil
}

func createPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, name, app string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{"app": app, kube.LabelModel: "llama-3.1-8b"}},
		Spec: corev1.PodSpec{NodeName: "gpu-node-1",
			Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setSlice writes the EndpointSlice a Service's controller would keep:
// one endpoint per pod, its readiness, its node.
func setSlice(ctx context.Context, t *testing.T, cs kubernetes.Interface, port int, pods []string, ready map[string]bool, addr map[string]string) {
	t.Helper()
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-llama-x1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: "vllm-llama"}},
		AddressType: discoveryv1.AddressTypeFQDN,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(port)), Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr[p]},
			Conditions: discoveryv1.EndpointConditions{Ready: new(ready[p])},
			NodeName:   new("gpu-node-1"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p}})
	}
	cur, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, s.Name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// edsWatch is an ADS client subscribed to one cluster's EDS for a node: it
// ACKs every response and keeps the endpoints of the last one.
type edsWatch struct {
	mu      sync.Mutex
	hosts   []string
	changed chan struct{}
	stop    func()
}

func watchEDS(ctx context.Context, t *testing.T, addr, node, cluster string) *edsWatch {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &edsWatch{changed: make(chan struct{}, 1)}
	req := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.EndpointType, ResourceNames: []string{cluster}}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			var hosts []string
			for _, a := range resp.Resources {
				var cla endpointv3.ClusterLoadAssignment
				if a.UnmarshalTo(&cla) != nil || cla.ClusterName != cluster {
					continue
				}
				for _, le := range cla.Endpoints {
					for _, e := range le.LbEndpoints {
						sa := e.GetEndpoint().GetAddress().GetSocketAddress()
						hosts = append(hosts, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
					}
				}
			}
			sort.Strings(hosts)
			w.mu.Lock()
			w.hosts = hosts
			w.mu.Unlock()
			select {
			case w.changed <- struct{}{}:
			default:
			}
			ack := &discoverygrpc.DiscoveryRequest{Node: req.Node, TypeUrl: req.TypeUrl, ResourceNames: req.ResourceNames,
				VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
			if stream.Send(ack) != nil {
				return
			}
		}
	}()
	w.stop = func() {
		cancel()
		<-done
		conn.Close()
	}
	return w
}

// await waits until the EDS endpoints are want (any order), or fails the
// test after d.
func (w *edsWatch) await(t *testing.T, d time.Duration, want []string) {
	t.Helper()
	want = slices.Clone(want)
	sort.Strings(want)
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		got := slices.Clone(w.hosts)
		w.mu.Unlock()
		if slices.Equal(got, want) {
			return
		}
		select {
		case <-w.changed:
		case <-deadline.C:
			t.Fatalf("EDS after %v: %v, want %v", d, got, want)
		}
	}
}
