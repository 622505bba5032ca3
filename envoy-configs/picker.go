package envoyconfigs

import (
	_ "embed"
	"fmt"
	"net"
	"strconv"
	"strings"
	"text/template"
)

//go:embed endpoint-picker.yaml.tmpl
var pickerTmplText string

var pickerTmpl = template.Must(template.New("endpoint-picker").Option("missingkey=error").Parse(pickerTmplText))

// Variants of the gateway-style bootstrap (endpoint-picker.yaml.tmpl).
const (
	// OriginalDst routes to the picked endpoint through an ORIGINAL_DST
	// cluster reading x-gateway-destination-endpoint.
	OriginalDst = "original-dst"
	// OverrideHost routes through a cluster of the pool's endpoints with
	// the override_host load-balancing policy.
	OverrideHost = "override-host"
)

// PickerParams fill the gateway-style bootstrap.
type PickerParams struct {
	// Variant is OriginalDst or OverrideHost.
	Variant string
	// ListenAddress and ListenPort: the client-facing HTTP listener.
	ListenAddress string
	ListenPort    int
	// PickerAddress is the endpoint picker's gRPC address ("ip:port").
	PickerAddress string
	// Endpoints are the pool's engines ("ip:port"), OverrideHost only.
	Endpoints []string
	// Subset, if set, is a fixed subset hint every request carries.
	Subset []string
	// Retries is the route's retry count (0: no retry policy, so no
	// fallback is ever tried).
	Retries int
	// FailOpen sets ext_proc's failure_mode_allow (OverrideHost only).
	FailOpen bool
	// MessageTimeout bounds each ext_proc round trip (default "10s").
	MessageTimeout string
}

type pickerData struct {
	PickerParams
	PickerHost string
	PickerPort int
	Endpoints  []hostPort
}

// RenderEndpointPicker renders the gateway-style bootstrap, without an
// admin section (a runner adds its own).
func RenderEndpointPicker(p PickerParams) (string, error) {
	if p.Variant != OriginalDst && p.Variant != OverrideHost {
		return "", fmt.Errorf("endpoint-picker bootstrap: variant %q: want %s or %s", p.Variant, OriginalDst, OverrideHost)
	}
	if p.FailOpen && p.Variant == OriginalDst {
		return "", fmt.Errorf("endpoint-picker bootstrap: fail-open needs %s (an ORIGINAL_DST cluster without the picker's header would connect back to the listener)", OverrideHost)
	}
	if p.Variant == OverrideHost && len(p.Endpoints) == 0 {
		return "", fmt.Errorf("endpoint-picker bootstrap: %s needs the pool's endpoints", OverrideHost)
	}
	if p.ListenAddress == "" {
		p.ListenAddress = "127.0.0.1"
	}
	if p.ListenPort <= 0 || p.ListenPort > 65535 || p.Retries < 0 {
		return "", fmt.Errorf("endpoint-picker bootstrap: listen port %d or retries %d out of range", p.ListenPort, p.Retries)
	}
	if p.MessageTimeout == "" {
		p.MessageTimeout = "10s"
	}
	d := pickerData{PickerParams: p}
	var err error
	if d.PickerHost, d.PickerPort, err = splitIPPort(p.PickerAddress); err != nil {
		return "", fmt.Errorf("endpoint-picker bootstrap: picker address: %w", err)
	}
	for _, e := range p.Endpoints {
		h, port, err := splitIPPort(e)
		if err != nil {
			return "", fmt.Errorf("endpoint-picker bootstrap: endpoint: %w", err)
		}
		d.Endpoints = append(d.Endpoints, hostPort{Host: h, Port: port})
	}
	for _, s := range p.Subset {
		if _, _, err := splitIPPort(s); err != nil {
			return "", fmt.Errorf("endpoint-picker bootstrap: subset: %w", err)
		}
	}
	var b strings.Builder
	if err := pickerTmpl.Execute(&b, d); err != nil {
		return "", err
	}
	return b.String(), nil
}

// splitIPPort splits "ip:port" (an IP: the bootstrap's STATIC clusters and
// the picker's answers name addresses, not names).
func splitIPPort(a string) (string, int, error) {
	h, ps, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", a, err)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port <= 0 || port > 65535 || net.ParseIP(h) == nil {
		return "", 0, fmt.Errorf("%q: want ip:port", a)
	}
	return h, port, nil
}
