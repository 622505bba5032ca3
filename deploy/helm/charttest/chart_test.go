// Package charttest renders deploy/helm/inferlb with Helm's own library
// (helm template) and applies what it renders to a real kube-apiserver
// (internal/k8stest). It is its own module so that Helm's dependencies stay
// out of the product's go.mod; `make test-helm` runs it.
package charttest

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/inferlb/inferlb/controlplane/discovery/kube"
	"github.com/inferlb/inferlb/internal/k8stest"
)

// render is `helm template RELEASE ../inferlb --namespace NS` with values.
func render(t *testing.T, release, ns string, values map[string]any) (string, error) {
	t.Helper()
	ch, err := loader.Load("../inferlb")
	if err != nil {
		t.Fatal(err)
	}
	inst := action.NewInstall(&action.Configuration{})
	inst.DryRun, inst.ClientOnly, inst.Replace = true, true, true
	inst.ReleaseName, inst.Namespace = release, ns
	inst.KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}
	rel, err := inst.Run(ch, values)
	if err != nil {
		return "", err
	}
	return rel.Manifest, nil
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	slices.Sort(out)
	return out
}

// The chart renders with Helm, every object it renders is accepted by a
// real API server (the InferencePool against its CRD, the ServiceMonitor
// against the Prometheus Operator's), and the RBAC it grants is what
// Kubernetes discovery needs: discovery running as the chart's service
// account finds the pool's engine.
func TestHelmChartAppliesToKubernetes(t *testing.T) {
	defer leaktest.AfterTest(t)()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Bad values are refused at render time, naming the value.
	if _, err := render(t, "bad", "llm", map[string]any{"extproc": map[string]any{"mode": "sidecar"}}); err == nil ||
		!strings.Contains(err.Error(), `extproc.mode: want endpoint-picker or ext_proc, got "sidecar"`) {
		t.Errorf("extproc.mode sidecar: err = %v", err)
	}
	if _, err := render(t, "bad", "llm", map[string]any{"controlPlane": map[string]any{"replicas": 0}}); err == nil ||
		!strings.Contains(err.Error(), "controlPlane.replicas must be at least 1") {
		t.Errorf("controlPlane.replicas 0: err = %v", err)
	}

	picker, err := render(t, "prod", "llm", nil)
	if err != nil {
		t.Fatal(err)
	}
	beside, err := render(t, "edge", "edge", map[string]any{
		"extproc":        map[string]any{"mode": "ext_proc"},
		"serviceMonitor": map[string]any{"enabled": true},
		"controlPlane":   map[string]any{"replicas": 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(beside, "--control-plane=edge-inferlb-control-plane-0.edge-inferlb-control-plane.edge.svc:18000,edge-inferlb-control-plane-1.edge-inferlb-control-plane.edge.svc:18000,edge-inferlb-control-plane-2.edge-inferlb-control-plane.edge.svc:18000") {
		t.Errorf("ext_proc does not list every control-plane replica:\n%s", beside)
	}

	c := k8stest.Start(t)
	defer c.Stop()
	for _, f := range []string{"../../crds/inferencepools.inference.networking.k8s.io.yaml", "testdata/servicemonitors.monitoring.coreos.com.yaml"} {
		crd, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Apply(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Apply(ctx, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: llm}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: edge}\n")); err != nil {
		t.Fatal(err)
	}
	objs, err := c.Apply(ctx, []byte(picker))
	if err != nil {
		t.Fatalf("applying the endpoint-picker release: %v", err)
	}
	want := []string{"ClusterRole/prod-inferlb-llm-nodes", "ClusterRoleBinding/prod-inferlb-llm-nodes", "ConfigMap/prod-inferlb-fleet",
		"Deployment/prod-inferlb-epp", "InferencePool/llm", "Role/prod-inferlb-discovery", "RoleBinding/prod-inferlb-discovery",
		"Secret/prod-inferlb-token", "Service/prod-inferlb-control-plane", "Service/prod-inferlb-epp", "ServiceAccount/prod-inferlb",
		"StatefulSet/prod-inferlb-control-plane"}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Errorf("applied %v\nwant %v", got, want)
	}
	objs, err = c.Apply(ctx, []byte(beside))
	if err != nil {
		t.Fatalf("applying the ext_proc release with a ServiceMonitor: %v", err)
	}
	if got := kinds(objs); !slices.Contains(got, "ServiceMonitor/edge-inferlb") {
		t.Errorf("applied %v, no ServiceMonitor", got)
	}

	// Discovery as the chart's service account: what the pool selects, in
	// the pool's namespace, with the chart's ConfigMap.
	rc := c.RESTConfig()
	rc.Impersonate.UserName = "system:serviceaccount:llm:prod-inferlb"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	admin, _, err := c.Clients()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("llm").List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("the chart's service account may read Secrets: it needs no such right")
	}
	seedPool(ctx, t, admin)
	disc, err := kube.New(cs, dyn, kube.Config{Namespace: "llm", Pool: "llm", ConfigMap: "prod-inferlb-fleet"})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(ctx)
	spec, _, runErr, err := disc.WaitFirst(dctx, time.Minute)
	stop()
	if rerr := runErr(); rerr != nil {
		t.Errorf("discovery: %v", rerr)
	}
	if err != nil {
		t.Fatalf("discovery as the chart's service account: %v", err)
	}
	if len(spec.Engines) != 1 || spec.Engines[0].Address != "192.0.2.10:8000" || spec.Engines[0].Region != "local" || spec.Engines[0].GPU != "H100" {
		t.Errorf("discovered engines %+v, want vllm-0 at 192.0.2.10:8000 in local on H100", spec.Engines)
	}
}

// seedPool writes a node and one ready vLLM pod of the chart's default pool
// (app=vllm, port 8000) with its EndpointSlice. Nothing dials the address
// (192.0.2.10, a documentation address): discovery only lists it.
func seedPool(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1",
		Labels: map[string]string{kube.NodeLabelRegion: "local", kube.NodeLabelGPU: "H100"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: "llm",
		Labels: map[string]string{"app": "vllm", kube.LabelModel: "llama-3.1-8b"}},
		Spec: corev1.PodSpec{NodeName: "gpu-1", Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	if _, err := cs.CoreV1().Pods("llm").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "vllm-x", Namespace: "llm",
		Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8000))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
			NodeName: new("gpu-1"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: "vllm-0"}}}}
	if _, err := cs.DiscoveryV1().EndpointSlices("llm").Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
