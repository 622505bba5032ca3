// Package envoyconfigs holds the commented Envoy bootstrap of an inferlb
// frontend node (frontend.yaml.tmpl) and renders it in its two variants,
// fail-closed and fail-open. `inferlb extproc --print-bootstrap` prints one;
// the tests load both into a real Envoy.
package envoyconfigs

import (
	_ "embed"
	"fmt"
	"strings"
	"text/template"
)

//go:embed frontend.yaml.tmpl
var frontendTmpl string

var tmpl = template.Must(template.New("frontend").Option("missingkey=error").Parse(frontendTmpl))

// Variants of the frontend bootstrap.
const (
	FailClosed = "fail-closed"
	FailOpen   = "fail-open"
)

// Params fill the template.
type Params struct {
	// Variant is FailClosed or FailOpen.
	Variant string
	// NodeID and NodeCluster identify the frontend to the control plane;
	// Region is its locality region.
	NodeID, NodeCluster, Region string
	// ListenAddress and ListenPort: the client-facing HTTP listener.
	ListenAddress string
	ListenPort    int
	// ExtProcHost/Port: the ext_proc service; XDSHost/Port: the control plane.
	ExtProcHost string
	ExtProcPort int
	XDSHost     string
	XDSPort     int
	// BodyLimit is the request buffer limit in bytes (= ext_proc's).
	BodyLimit int
	// MessageTimeout bounds each ext_proc round trip (e.g. "1s").
	MessageTimeout string
	// FallbackCluster is the cluster of the fail-open route (fail-open only).
	FallbackCluster string
}

// Render returns the bootstrap YAML (without an admin section).
func Render(p Params) (string, error) {
	if p.Variant != FailClosed && p.Variant != FailOpen {
		return "", fmt.Errorf("envoyconfigs: variant %q: want %q or %q", p.Variant, FailClosed, FailOpen)
	}
	if p.Variant == FailOpen && p.FallbackCluster == "" {
		return "", fmt.Errorf("envoyconfigs: fail-open needs a FallbackCluster")
	}
	if p.NodeID == "" || p.ListenPort <= 0 || p.ExtProcPort <= 0 || p.XDSPort <= 0 || p.BodyLimit <= 0 {
		return "", fmt.Errorf("envoyconfigs: NodeID, ListenPort, ExtProcPort, XDSPort and BodyLimit are required")
	}
	// A port past 65535 renders a bootstrap Envoy refuses with a message
	// about its own schema; say which parameter is wrong instead.
	for _, port := range []struct {
		name string
		v    int
	}{{"ListenPort", p.ListenPort}, {"ExtProcPort", p.ExtProcPort}, {"XDSPort", p.XDSPort}} {
		if port.v > 65535 {
			return "", fmt.Errorf("envoyconfigs: %s %d is not a TCP port (1–65535)", port.name, port.v)
		}
	}
	if p.NodeCluster == "" {
		p.NodeCluster = p.NodeID
	}
	if p.ListenAddress == "" {
		p.ListenAddress = "127.0.0.1"
	}
	if p.ExtProcHost == "" {
		p.ExtProcHost = "127.0.0.1"
	}
	if p.XDSHost == "" {
		p.XDSHost = "127.0.0.1"
	}
	if p.MessageTimeout == "" {
		p.MessageTimeout = "1s"
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, p); err != nil {
		return "", err
	}
	return b.String(), nil
}
