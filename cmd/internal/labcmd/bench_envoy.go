package labcmd

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
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/inferlb/inferlb/api/headers"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/server"
	"github.com/inferlb/inferlb/xds/translate"
)

// nullProcessor is the cheapest ext_proc service Envoy can have under the
// same bootstrap: it names the cluster in its answer to the request headers
// (at once: Envoy streams the body without waiting for it), answers every
// body chunk with "continue", reading nothing, and ends the stream once the
// body is whole, as inferlb's service does. Envoy + nullProcessor is
// Envoy's own cost of the ext_proc protocol (buffering the body, sending it
// over gRPC, the extra round trips); inferlb's service adds its decisions
// on top of that.
type nullProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	cluster string
}

func (n nullProcessor) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	declared, got := -1, 0
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
			for _, h := range req.GetRequestHeaders().GetHeaders().GetHeaders() {
				if h.GetKey() == "content-length" {
					declared, _ = strconv.Atoi(string(h.GetRawValue()))
				}
			}
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
		if b := req.GetRequestBody(); b != nil {
			// Like inferlb's: the stream ends once the body is whole (a
			// streamed body's end, or its declared length).
			if got += len(b.GetBody()); b.GetEndOfStream() || (declared >= 0 && got >= declared) {
				return nil
			}
		}
	}
}

func newNullExtprocCmd() *cobra.Command {
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
	return cmd
}

// benchSetup is one of the proxies compared side by side.
type benchSetup struct {
	name  string
	url   string
	envoy *envoyrun.Envoy
	child *child // its ext_proc process, if any
}

// benchRig is what the Envoy comparison runs: an upstream, the control
// plane, the two ext_proc processes and the three Envoys.
type benchRig struct {
	setups []benchSetup
	stops  []func() // in reverse order
}

func (r *benchRig) close() {
	for i := len(r.stops) - 1; i >= 0; i-- {
		r.stops[i]()
	}
}

func (b *extprocBench) runEnvoy(ctx context.Context, out io.Writer, dir string, bodyLimit int) error {
	rig := &benchRig{}
	defer rig.close()
	if err := b.startRig(ctx, rig, dir, bodyLimit); err != nil {
		return err
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
	for _, s := range rig.setups {
		if err := envoyrun.Poll(ctx, 20*time.Second, 50*time.Millisecond, func() error { return post(s.url, warm, "ready") }); err != nil {
			return fmt.Errorf("%s not ready: %w", s.name, err)
		}
	}
	return b.envoyTable(ctx, out, rig.setups, post)
}

// startRig starts the comparison's processes; rig.stops ends them.
func (b *extprocBench) startRig(ctx context.Context, rig *benchRig, dir string, bodyLimit int) error {
	upstream, stopUp, err := benchUpstream()
	if err != nil {
		return err
	}
	rig.stops = append(rig.stops, stopUp)
	xdsAddr, stopCP, err := benchControlPlane(ctx, upstream)
	if err != nil {
		return err
	}
	rig.stops = append(rig.stops, stopCP)
	prof := ""
	if !b.protocol {
		prof = b.childProf // the profile is of one run only
	}
	ch, err := startExtProcChild(ctx, dir, bodyLimit, xdsAddr, prof, b.binary, "")
	if err != nil {
		return err
	}
	rig.stops = append(rig.stops, ch.stop)
	nullPort, err := envoyrun.FreePort()
	if err != nil {
		return err
	}
	nullAddr := fmt.Sprintf("127.0.0.1:%d", nullPort)
	nullCh, err := startChild(ctx, "", nullAddr, "bench", "null-extproc", "--listen", nullAddr, "--cluster", benchCluster,
		"--body-limit", strconv.Itoa(bodyLimit))
	if err != nil {
		return err
	}
	rig.stops = append(rig.stops, nullCh.stop)
	for _, s := range []struct {
		name, variant string
		extProc       *child
	}{{"Envoy alone", envoyconfigs.Direct, nil}, {"+ null ext_proc", envoyconfigs.FailClosed, nullCh}, {"+ inferlb ext_proc", envoyconfigs.FailClosed, ch}} {
		e, url, err := b.benchFrontend(dir, s.variant, s.extProc, xdsAddr, bodyLimit)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		rig.stops = append(rig.stops, e.Stop)
		rig.setups = append(rig.setups, benchSetup{name: s.name, url: url, envoy: e, child: s.extProc})
	}
	return nil
}

// benchUpstream serves a small completion at once, reading the body.
func benchUpstream() (addr string, stop func(), err error) {
	ul, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	reply := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	us := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		_, _ = w.Write(reply)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = us.Serve(ul) }()
	return ul.Addr().String(), func() { _ = us.Close() }, nil
}

// benchCluster is the class cluster of the Envoy comparison (class llama;
// benchPolicy names it).
const (
	benchClusterPrefix = "class-"
	benchCluster       = benchClusterPrefix + "llama"
)

// benchControlPlane is inferlb's xDS server with the bench frontend's
// resources: CDS/EDS from xds/translate (production's builder and
// defaults: Maglev, hash_balance_factor 150, health checks, outlier
// detection) for one class whose one engine is the upstream, and the bench
// policy.
func benchControlPlane(ctx context.Context, upstream string) (addr string, stop func(), err error) {
	srv, err := server.New(server.Config{Registry: prometheus.NewRegistry(), Auth: auth.Server{Insecure: true},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return "", nil, err
	}
	o := translate.DefaultOptions()
	o.ClusterPrefix = benchClusterPrefix
	r, err := translate.Translate(translate.FixedNode(benchNode, "local", []translate.FixedClass{{Name: strings.TrimPrefix(benchCluster, benchClusterPrefix),
		Engines: []translate.FixedEngine{{ID: "upstream", Address: upstream, Weight: 1}}}}), o)
	if err != nil {
		return "", nil, err
	}
	r.Policy = benchPolicy()
	if err := srv.Publish(ctx, r); err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	return l.Addr().String(), func() { srv.Stop(); <-done }, nil
}

// benchFrontend starts an Envoy from the frontend bootstrap: variant
// direct (no ext_proc) or with the ext_proc process extProc.
func (b *extprocBench) benchFrontend(dir, variant string, extProc *child, xdsAddr string, bodyLimit int) (*envoyrun.Envoy, string, error) {
	_, xp, _ := net.SplitHostPort(xdsAddr)
	xdsPort, _ := strconv.Atoi(xp)
	extPort := 0
	if extProc != nil {
		_, ep, _ := net.SplitHostPort(extProc.addr)
		extPort, _ = strconv.Atoi(ep)
	}
	port, err := envoyrun.FreePort()
	if err != nil {
		return nil, "", err
	}
	boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: variant, NodeID: benchNode, Region: "local",
		ListenPort: port, ExtProcPort: extPort, XDSPort: xdsPort, BodyLimit: bodyLimit, FallbackCluster: benchCluster, BodyMode: b.bodyMode})
	if err != nil {
		return nil, "", err
	}
	edir := filepath.Join(dir, fmt.Sprintf("envoy-%d", port))
	if err := os.MkdirAll(edir, 0o755); err != nil {
		return nil, "", err
	}
	e, err := envoyrun.Start(envoyrun.Options{Bootstrap: boot, Concurrency: b.envoyWorkers}, edir)
	if err != nil {
		return nil, "", err
	}
	return e, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), nil
}

// envoyTable measures every cell (body size × concurrency) on every setup
// and prints the table.
func (b *extprocBench) envoyTable(ctx context.Context, out io.Writer, setups []benchSetup, post func(url string, body []byte, session string) error) error {
	fmt.Fprintf(out, "\nEnvoy alone, Envoy + a null ext_proc (answers continue, reads nothing) and Envoy + inferlb ext_proc, side by side:\n"+
		"%d Envoy worker(s) each, one frontend bootstrap (alone: its direct variant, without ext_proc), same CDS/EDS cluster, same upstream answering at once, each ext_proc its own process, %v per cell, setups in turn\n", b.envoyWorkers, b.duration)
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
			printCell(tw, size, c, setups, res)
		}
	}
	return tw.Flush()
}

// printCell writes one cell's rows, each setup against the first (alone).
func printCell(tw io.Writer, size, conc int, setups []benchSetup, res []benchResult) {
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
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%s\t%.2f\t%.2f\t%s\t%s\t%.3f\t%s\t%d\t\n", sizeName(size), conc, s.name,
			r.rps, ratio, ms(r.p50), ms(r.p99), added50, added99,
			r.envoyCPU*1000/max(float64(r.ok), 1), xp, r.bad)
		if r.err != nil {
			slog.Warn("bench request failed", "setup", s.name, "err", r.err)
		}
	}
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
	e0 := cr.seconds(s.envoy.Pid())
	var c0 float64
	if s.child != nil {
		c0 = cr.seconds(s.child.cmd.Process.Pid)
	}
	t0 := time.Now()
	ok, bad, lat, ferr := closedLoop(ctx, conc, b.duration, f)
	r := benchResult{rps: float64(ok) / time.Since(t0).Seconds(), ok: ok, bad: bad, p50: lat.pct(0.5), p99: lat.pct(0.99), err: ferr}
	r.envoyCPU = cr.seconds(s.envoy.Pid()) - e0
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
