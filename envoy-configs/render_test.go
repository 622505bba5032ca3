package envoyconfigs_test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"gopkg.in/yaml.v3"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/translate"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// Every variant loads into a real Envoy (ports templated), which then holds
// the frontend listener with the ext_proc filter in the configured failure
// mode (direct: without one). Behaviour (routing, failure modes) is tested
// in package extproc.
func TestVariantsLoadInEnvoy(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	cp := xdstest.StartControlPlane(t, "")
	if err := cp.SetClusters("fe-test", 150, translate.FixedClass{Name: "a",
		Engines: []translate.FixedEngine{{ID: "e", Address: "127.0.0.1:9", Weight: 1}}}); err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(cp.Addr)
	xdsPort, _ := strconv.Atoi(p)
	for _, vm := range []struct{ v, mode string }{{envoyconfigs.FailClosed, ""}, {envoyconfigs.FailOpen, ""}, {envoyconfigs.Direct, ""},
		{envoyconfigs.FailClosed, envoyconfigs.BodyStreamed}} {
		v := vm.v
		t.Run(v+"/"+vm.mode, func(t *testing.T) {
			y, err := envoyconfigs.Render(envoyconfigs.Params{Variant: v, NodeID: "fe-test", Region: "eu",
				ListenPort: envoytest.FreePort(t), ExtProcPort: envoytest.FreePort(t), XDSPort: xdsPort,
				BodyLimit: 1 << 20, FallbackCluster: "class-a", BodyMode: vm.mode})
			if err != nil {
				t.Fatal(err)
			}
			e := envoytest.Start(t, envoytest.Options{Bootstrap: y})
			dump, err := e.Admin("/config_dump")
			if err != nil {
				t.Fatal(err)
			}
			s := string(dump)
			wantAllow := v == envoyconfigs.FailOpen
			if strings.Contains(s, `"failure_mode_allow": true`) != wantAllow {
				t.Fatalf("%s: failure_mode_allow is not %v in the loaded config", v, wantAllow)
			}
			for _, want := range []string{`"cluster_header": "x-inferlb-cluster"`,
				`"header_name": "x-inferlb-affinity-key"`, "envoy.retry_host_predicates.previous_hosts",
				`"per_connection_buffer_limit_bytes": 1048576`, "class-a"} {
				if !strings.Contains(s, want) {
					t.Fatalf("%s: loaded config lacks %s", v, want)
				}
			}
			// The body buffered by default; streamed to ext_proc without
			// waiting for the headers' answer on request, with the timer
			// ext_proc may extend for a slow upload up to request_timeout
			// plus 5 s.
			switch {
			case vm.mode == envoyconfigs.BodyStreamed:
				for _, want := range []string{`"request_body_mode": "STREAMED"`, `"send_body_without_waiting_for_header_response": true`,
					`"max_message_timeout": "20s"`, `"request_trailer_mode": "SEND"`} {
					if !strings.Contains(s, want) {
						t.Fatalf("%s: loaded config lacks %s", v, want)
					}
				}
			case v != envoyconfigs.Direct:
				// Buffered, but for the bodies of 1 MiB and more (the
				// limit here), which a route of their own streams.
				for _, want := range []string{`"request_body_mode": "BUFFERED"`, `"send_body_without_waiting_for_header_response": true`,
					`"max_message_timeout": "20s"`, `"name": "content-length"`, `"start": "1048576"`,
					"type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute", `"request_body_mode": "STREAMED"`} {
					if !strings.Contains(s, want) {
						t.Fatalf("%s: the default lacks %s", v, want)
					}
				}
			}
			// The filter's config type (the filter's name alone is in the
			// dump's list of compiled-in extensions).
			if strings.Contains(s, "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor") != (v != envoyconfigs.Direct) {
				t.Fatalf("%s: want the ext_proc filter loaded: %v", v, v != envoyconfigs.Direct)
			}
		})
	}
	if _, err := envoyconfigs.Render(envoyconfigs.Params{Variant: "fail-sideways"}); err == nil {
		t.Fatal("unknown variant accepted")
	}
	if _, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailOpen, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1, BodyLimit: 1}); err == nil {
		t.Fatal("fail-open without a fallback cluster accepted")
	}
	if _, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.Direct, NodeID: "n", ListenPort: 1, XDSPort: 1, BodyLimit: 1}); err == nil {
		t.Fatal("direct without a fallback cluster accepted")
	}
	_, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1, BodyLimit: 1, BodyMode: "chunked"})
	if err == nil || !strings.Contains(err.Error(), `BodyMode "chunked": want buffered or streamed`) {
		t.Fatalf("an unknown body mode: want an error naming it, got %v", err)
	}
	_, err = envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1, BodyLimit: 1, MessageTimeout: "150ms", BodyMode: envoyconfigs.BodyStreamed})
	if err == nil || !strings.Contains(err.Error(), `MessageTimeout "150ms": with bodies streamed (BodyMode streamed, or StreamAbove), want at least 200ms`) {
		t.Fatalf("a message timeout shorter than twice ext_proc's upload grace: want an error naming MessageTimeout, got %v", err)
	}
	// Buffered, the large bodies are streamed by default, and need the
	// same; with none streamed, any positive message timeout does.
	buffered := envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1, BodyLimit: 4 << 20, MessageTimeout: "150ms"}
	if _, err := envoyconfigs.Render(buffered); err == nil || !strings.Contains(err.Error(), `MessageTimeout "150ms": with bodies streamed`) {
		t.Fatalf("buffered, large bodies streamed, 150ms: want an error naming MessageTimeout, got %v", err)
	}
	buffered.StreamAbove = -1
	if _, err := envoyconfigs.Render(buffered); err != nil {
		t.Fatalf("buffered, StreamAbove -1, 150ms: %v", err)
	}
	_, err = envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 70000, ExtProcPort: 1, XDSPort: 1, BodyLimit: 1})
	if err == nil || !strings.Contains(err.Error(), "ListenPort 70000") {
		t.Fatalf("port 70000: want an error naming ListenPort, got %v", err)
	}
}

// Render's check of message_timeout uses ext_proc's upload grace.
func TestUploadGraceIsExtProcs(t *testing.T) {
	if envoyconfigs.UploadGrace != extproc.UploadGrace {
		t.Fatalf("envoy-configs takes ext_proc's upload grace as %v; it is %v", envoyconfigs.UploadGrace, extproc.UploadGrace)
	}
}

// The bootstrap lets ext_proc extend its timer as far as its
// --upload-timeout (default: request_timeout plus 5 s), and refuses one
// within the grace.
func TestUploadTimeoutRendered(t *testing.T) {
	base := envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n", ListenPort: 1, ExtProcPort: 1, XDSPort: 1, BodyLimit: 1, BodyMode: envoyconfigs.BodyStreamed}
	for _, c := range []struct {
		upload  time.Duration
		request string
		want    string
	}{{0, "", `max_message_timeout: "20s"`}, {0, "30s", `max_message_timeout: "35s"`}, {time.Minute, "", `max_message_timeout: "1m0s"`}} {
		p := base
		p.UploadTimeout, p.RequestTimeout = c.upload, c.request
		y, err := envoyconfigs.Render(p)
		if err != nil || !strings.Contains(y, c.want) {
			t.Fatalf("upload timeout %v, request timeout %q: want %s, got %v", c.upload, c.request, c.want, err)
		}
	}
	p := base
	p.UploadTimeout = 100 * time.Millisecond
	if _, err := envoyconfigs.Render(p); err == nil || !strings.Contains(err.Error(), "UploadTimeout 100ms") {
		t.Fatalf("an upload timeout within the grace: want an error naming UploadTimeout, got %v", err)
	}
}

// IPv6 hosts (as `--listen [::1]:9002` gives them) render as YAML strings:
// unquoted, "::1" broke the flow mapping it sits in.
func TestRenderIPv6Hosts(t *testing.T) {
	y, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "n",
		ListenAddress: "::1", ListenPort: 10000, ExtProcHost: "::1", ExtProcPort: 9002, XDSHost: "fd00::2", XDSPort: 18000, BodyLimit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		StaticResources struct {
			Listeners []struct {
				Address struct {
					SocketAddress struct {
						Address string `yaml:"address"`
					} `yaml:"socket_address"`
				} `yaml:"address"`
			} `yaml:"listeners"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(y), &doc); err != nil {
		t.Fatalf("rendered bootstrap is not YAML: %v", err)
	}
	if l := doc.StaticResources.Listeners; len(l) == 0 || l[0].Address.SocketAddress.Address != "::1" {
		t.Fatalf("listener address: %+v", l)
	}
	for _, want := range []string{`address: "::1", port_value: 9002`, `address: "fd00::2", port_value: 18000`} {
		if !strings.Contains(y, want) {
			t.Errorf("bootstrap lacks %s", want)
		}
	}
}
