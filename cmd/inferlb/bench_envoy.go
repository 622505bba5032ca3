package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/inferlb/inferlb/api/headers"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc/cpfake"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// envoyProc is an Envoy process run by the benchmark, with its log file.
type envoyProc struct {
	*child
	log string
}

func startEnvoy(ctx context.Context, dir, name, bootstrap string, port, workers int) (*envoyProc, error) {
	bin, err := envoytest.Binary()
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, name+".yaml")
	bootstrap += "\nadmin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 0 }\n"
	if err := os.WriteFile(cfg, []byte(bootstrap), 0o644); err != nil {
		return nil, err
	}
	log := filepath.Join(dir, name+".log")
	cmd := exec.Command(bin, "-c", cfg, "--log-level", "warning", "--log-path", log, "--concurrency", strconv.Itoa(workers),
		"--disable-hot-restart", "--use-dynamic-base-id", "--drain-time-s", "1")
	c, err := startProc(ctx, cmd, fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		b, _ := os.ReadFile(log)
		return nil, fmt.Errorf("envoy %s: %w\n%s", name, err, b)
	}
	return &envoyProc{child: c, log: log}, nil
}

// envoyAlone is the baseline: the same listener limits and timeouts, a
// static cluster to the upstream, hashed on the session id, no ext_proc.
func envoyAlone(port, upstreamPort, bodyLimit int) string {
	return fmt.Sprintf(`static_resources:
  listeners:
  - name: alone
    address: { socket_address: { address: 127.0.0.1, port_value: %d } }
    per_connection_buffer_limit_bytes: %d
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: alone
          request_timeout: 0s
          stream_idle_timeout: 300s
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: upstream
                  hash_policy: [{ header: { header_name: x-session-id } }]
                  timeout: 0s
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    lb_policy: MAGLEV
    connect_timeout: 1s
    circuit_breakers: { thresholds: [{ max_requests: 100000, max_pending_requests: 100000, max_connections: 100000 }] }
    load_assignment:
      cluster_name: upstream
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: %d } } } }] }]
`, port, bodyLimit, upstreamPort)
}

// nullProcessor is the cheapest ext_proc service Envoy can have under the
// same bootstrap: it names the cluster from the request headers and answers
// every message with "continue", reading nothing, and ends the stream after
// the body as inferlb's service does. Envoy + nullProcessor is
// Envoy's own cost of the ext_proc protocol (buffering the body, sending it
// over gRPC, the extra round trips); inferlb's service adds its decisions
// on top of that.
type nullProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	cluster string
}

func (n nullProcessor) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		var resp *extprocv3.ProcessingResponse
		switch req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					{Header: &corev3.HeaderValue{Key: headers.Cluster, RawValue: []byte(n.cluster)}}}}}}}}
		case *extprocv3.ProcessingRequest_RequestBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		default:
			return fmt.Errorf("null processor: unexpected %T", req.Request)
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		if _, ok := req.Request.(*extprocv3.ProcessingRequest_RequestBody); ok {
			return nil // like inferlb's: the stream ends with the decision
		}
	}
}

func init() {
	var listen, cluster string
	var bodyLimit int
	cmd := &cobra.Command{
		Use:    "null-extproc",
		Short:  "The null ext_proc of bench extproc's Envoy comparison (run by it as a child process)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The same GC target as the service's default (--gc-percent).
			if _, set := os.LookupEnv("GOGC"); !set {
				debug.SetGCPercent(400)
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			g := grpc.NewServer(service.ServerOptions(bodyLimit)...)
			extprocv3.RegisterExternalProcessorServer(g, nullProcessor{cluster: cluster})
			go func() {
				<-cmd.Context().Done()
				g.Stop()
			}()
			return g.Serve(lis)
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:0", "gRPC listen address")
	f.StringVar(&cluster, "cluster", "", "value of the cluster header it sets")
	f.IntVar(&bodyLimit, "body-limit", 4<<20, "largest body in bytes")
	benchCmd.AddCommand(cmd)
}

// benchSetup is one of the proxies compared side by side.
type benchSetup struct {
	name  string
	url   string
	envoy *envoyProc
	child *child // its ext_proc process, if any
}

func (b *extprocBench) runEnvoy(ctx context.Context, out io.Writer, dir string, bodyLimit int) error {
	// Upstream: reads the body, answers a small completion at once.
	ul, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	reply := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	us := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		_, _ = w.Write(reply)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = us.Serve(ul) }()
	defer us.Close()
	upPort := ul.Addr().(*net.TCPAddr).Port

	cp, err := cpfake.New("")
	if err != nil {
		return err
	}
	defer cp.Stop()
	if err := cp.SetClusters(benchNode, []cpfake.Cluster{{Name: "class-llama", HashBalanceFactor: 150,
		Endpoints: []cpfake.Endpoint{{Addr: ul.Addr().String(), Weight: 1}}}}); err != nil {
		return err
	}
	if err := cp.SetPolicy(benchPolicy()); err != nil {
		return err
	}
	prof := ""
	if !b.protocol {
		prof = b.childProf // the profile is of one run only
	}
	ch, err := startExtProcChild(ctx, dir, bodyLimit, cp.Addr, prof)
	if err != nil {
		return err
	}
	defer ch.stop()
	nullPort, err := envoytest.FreeTCPPort()
	if err != nil {
		return err
	}
	nullAddr := fmt.Sprintf("127.0.0.1:%d", nullPort)
	nullCh, err := startChild(ctx, nullAddr, "bench", "null-extproc", "--listen", nullAddr, "--cluster", "class-llama",
		"--body-limit", strconv.Itoa(bodyLimit))
	if err != nil {
		return err
	}
	defer nullCh.stop()

	_, xp, _ := net.SplitHostPort(cp.Addr)
	xdsPort, _ := strconv.Atoi(xp)
	frontend := func(name string, extProcAddr string) (*envoyProc, string, error) {
		_, ep, _ := net.SplitHostPort(extProcAddr)
		extPort, _ := strconv.Atoi(ep)
		port, err := envoytest.FreeTCPPort()
		if err != nil {
			return nil, "", err
		}
		boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: benchNode, Region: "local",
			ListenPort: port, ExtProcPort: extPort, XDSPort: xdsPort, BodyLimit: bodyLimit})
		if err != nil {
			return nil, "", err
		}
		e, err := startEnvoy(ctx, dir, name, boot, port, b.envoyWorkers)
		return e, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), err
	}

	alonePort, err := envoytest.FreeTCPPort()
	if err != nil {
		return err
	}
	alone, err := startEnvoy(ctx, dir, "alone", envoyAlone(alonePort, upPort, bodyLimit), alonePort, b.envoyWorkers)
	if err != nil {
		return err
	}
	defer alone.stop()
	null, nullURL, err := frontend("null-extproc", nullAddr)
	if err != nil {
		return err
	}
	defer null.stop()
	with, withURL, err := frontend("with-extproc", ch.addr)
	if err != nil {
		return err
	}
	defer with.stop()
	setups := []benchSetup{
		{name: "Envoy alone", url: fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", alonePort), envoy: alone},
		{name: "+ null ext_proc", url: nullURL, envoy: null, child: nullCh},
		{name: "+ inferlb ext_proc", url: withURL, envoy: with, child: ch},
	}

	maxConc := 0
	for _, c := range b.concurrency {
		maxConc = max(maxConc, c)
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: maxConc, MaxConnsPerHost: 0}}
	defer hc.CloseIdleConnections()
	post := func(url string, body []byte, session string) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-session-id", session)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	// Ready when the frontends have their cluster from the control plane;
	// every setup has its upstream connections open before measuring.
	warm := chatBodies(1024, 1)[0]
	for _, s := range setups {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if err := post(s.url, warm, "ready"); err == nil {
				break
			} else if time.Now().After(deadline) {
				return fmt.Errorf("%s not ready: %v", s.name, err)
			}
			time.Sleep(50 * time.Millisecond) // polling interval
		}
	}

	fmt.Fprintf(out, "\nEnvoy alone, Envoy + a null ext_proc (answers continue, reads nothing) and Envoy + inferlb ext_proc, side by side:\n"+
		"%d Envoy worker(s) each, same upstream answering at once, same bootstrap for both ext_proc setups (each its own process), %v per cell, setups in turn\n", b.envoyWorkers, b.duration)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "body\tconcurrency\tsetup\treq/s\tvs alone\tp50 ms\tp99 ms\tadded p50 ms\tadded p99 ms\tEnvoy CPU ms/req\text_proc CPU ms/req\terrors\t")
	cell := 0
	for _, size := range b.sizes {
		bodies := chatBodies(size, 64)
		for _, c := range b.concurrency {
			// The setups take turns starting each cell, so drift in the
			// machine's load does not always land on the same one.
			res := make([]benchResult, len(setups))
			for j := range setups {
				k := (cell + j) % len(setups)
				s := setups[k]
				r, err := b.measure(ctx, s, c, func(w, i int) error {
					return post(s.url, bodies[(w*131+i)%len(bodies)], fmt.Sprintf("w%d-%d", w, i))
				})
				if err != nil {
					return err
				}
				res[k] = r
			}
			cell++
			base := res[0]
			for k, s := range setups {
				r := res[k]
				xp := "-"
				if s.child != nil {
					xp = fmt.Sprintf("%.3f", r.childCPU*1000/max(float64(r.ok), 1))
				}
				added50, added99, ratio := "-", "-", "-"
				if k > 0 {
					added50, added99 = fmt.Sprintf("%.2f", ms(r.p50-base.p50)), fmt.Sprintf("%.2f", ms(r.p99-base.p99))
				}
				if base.rps > 0 {
					ratio = fmt.Sprintf("%.2f", r.rps/base.rps)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%s\t%.2f\t%.2f\t%s\t%s\t%.3f\t%s\t%d\t\n", sizeName(size), c, s.name,
					r.rps, ratio, ms(r.p50), ms(r.p99), added50, added99,
					r.envoyCPU*1000/max(float64(r.ok), 1), xp, r.bad)
				if r.err != nil {
					slog.Warn("bench request failed", "setup", s.name, "err", r.err)
				}
			}
		}
	}
	return tw.Flush()
}

type benchResult struct {
	rps                float64
	ok, bad            int64
	p50, p99           time.Duration
	envoyCPU, childCPU float64 // seconds over the cell
	err                error
}

// measure runs one closed-loop cell against one setup, with the CPU time its
// Envoy (and ext_proc child) spent meanwhile.
func (b *extprocBench) measure(ctx context.Context, s benchSetup, conc int, f func(w, i int) error) (benchResult, error) {
	var cr cpuReader
	e0 := cr.seconds(s.envoy.cmd.Process.Pid)
	var c0 float64
	if s.child != nil {
		c0 = cr.seconds(s.child.cmd.Process.Pid)
	}
	t0 := time.Now()
	ok, bad, lat, ferr := closedLoop(ctx, conc, b.duration, f)
	r := benchResult{rps: float64(ok) / time.Since(t0).Seconds(), ok: ok, bad: bad, p50: lat.pct(0.5), p99: lat.pct(0.99), err: ferr}
	r.envoyCPU = cr.seconds(s.envoy.cmd.Process.Pid) - e0
	if s.child != nil {
		r.childCPU = cr.seconds(s.child.cmd.Process.Pid) - c0
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if cr.err != nil {
		return r, fmt.Errorf("CPU time of Envoy or ext_proc: %w", cr.err)
	}
	return r, nil
}
