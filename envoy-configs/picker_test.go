package envoyconfigs_test

import (
	"strings"
	"testing"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
)

// The gateway-style bootstrap refuses what it cannot render as meant;
// both variants render (they run in a real Envoy in extproc/picker's
// tests, TestEndpointPicker*).
func TestRenderEndpointPicker(t *testing.T) {
	ok := envoyconfigs.PickerParams{Variant: envoyconfigs.OverrideHost, ListenPort: 8081, PickerAddress: "127.0.0.1:9002",
		Endpoints: []string{"10.0.0.1:8000", "10.0.0.2:8000"}, Retries: 2}
	for name, c := range map[string]struct {
		mut  func(*envoyconfigs.PickerParams)
		want string // "" = renders
	}{
		"override-host":           {func(*envoyconfigs.PickerParams) {}, ""},
		"original-dst":            {func(p *envoyconfigs.PickerParams) { p.Variant, p.Endpoints = envoyconfigs.OriginalDst, nil }, ""},
		"subset":                  {func(p *envoyconfigs.PickerParams) { p.Subset = []string{"10.0.0.2:8000"} }, ""},
		"unknown variant":         {func(p *envoyconfigs.PickerParams) { p.Variant = "maglev" }, `variant "maglev"`},
		"fail-open original-dst":  {func(p *envoyconfigs.PickerParams) { p.Variant, p.FailOpen = envoyconfigs.OriginalDst, true }, "fail-open needs override-host"},
		"override-host, no pool":  {func(p *envoyconfigs.PickerParams) { p.Endpoints = nil }, "needs the pool's endpoints"},
		"picker not ip:port":      {func(p *envoyconfigs.PickerParams) { p.PickerAddress = "epp.svc:9002" }, `"epp.svc:9002": want ip:port`},
		"endpoint without a port": {func(p *envoyconfigs.PickerParams) { p.Endpoints = []string{"10.0.0.1"} }, `endpoint: "10.0.0.1"`},
		"bad subset":              {func(p *envoyconfigs.PickerParams) { p.Subset = []string{"x"} }, "subset"},
		"port out of range":       {func(p *envoyconfigs.PickerParams) { p.ListenPort = 70000 }, "listen port 70000"},
		"negative retries":        {func(p *envoyconfigs.PickerParams) { p.Retries = -1 }, "retries -1"},
	} {
		p := ok
		c.mut(&p)
		y, err := envoyconfigs.RenderEndpointPicker(p)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one naming %q", name, err, c.want)
		case c.want == "":
			for _, w := range []string{"x-gateway-destination-endpoint", "FULL_DUPLEX_STREAMED", "envoy.lb"} {
				if !strings.Contains(y, w) {
					t.Errorf("%s: rendered bootstrap lacks %s", name, w)
				}
			}
		}
	}
}
