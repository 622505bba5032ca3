package k8stest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// RESTConfig is a client configuration for the cluster (the admin token;
// TLS unverified: the server's certificate is self-signed, on loopback).
func (c *Cluster) RESTConfig() *rest.Config {
	return &rest.Config{Host: c.Host, BearerToken: c.Token, TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS: 100, Burst: 200, Timeout: 30 * time.Second,
		// The test slices use FQDN addresses (loopback IPs are refused), which
		// the server warns are deprecated on every write.
		WarningHandler: rest.NoWarnings{}}
}

// Clients returns a typed and a dynamic client for the cluster.
func (c *Cluster) Clients() (kubernetes.Interface, dynamic.Interface, error) {
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return nil, nil, err
	}
	return cs, dyn, nil
}

// Apply server-side applies every object of a multi-document YAML stream,
// in order, and returns them as applied. A CustomResourceDefinition is
// waited for until it is established, so that later documents may be its
// objects. The first object the server refuses ends it with an error
// naming the object.
func (c *Cluster) Apply(ctx context.Context, manifest []byte) ([]*unstructured.Unstructured, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		return nil, err
	}
	_, dyn, err := c.Clients()
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, fmt.Errorf("decode: %w", err)
		}
		if len(obj) == 0 {
			continue // an empty document
		}
		u := &unstructured.Unstructured{Object: obj}
		gvk := u.GroupVersionKind()
		what := fmt.Sprintf("%s %s/%s", gvk.Kind, u.GetNamespace(), u.GetName())
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			// A kind a CRD of this stream just added: the cache is stale.
			mapper.Reset()
			if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return out, fmt.Errorf("%s: %w", what, err)
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := u.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		body, err := u.MarshalJSON()
		if err != nil {
			return out, fmt.Errorf("%s: %w", what, err)
		}
		force := true
		got, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "k8stest", Force: &force})
		if err != nil {
			return out, fmt.Errorf("apply %s: %w", what, err)
		}
		out = append(out, got)
		if gvk.Kind == "CustomResourceDefinition" {
			if err := c.waitEstablished(ctx, dyn, m, u.GetName()); err != nil {
				return out, fmt.Errorf("%s: %w", what, err)
			}
			mapper.Reset()
		}
	}
}

func (c *Cluster) waitEstablished(ctx context.Context, dyn dynamic.Interface, m *meta.RESTMapping, name string) error {
	return Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		crd, err := dyn.Resource(m.Resource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cd := range conds {
			cm, _ := cd.(map[string]any)
			if cm["type"] == "Established" && cm["status"] == "True" {
				return nil
			}
		}
		return errors.New("not established yet")
	})
}
