package labcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/internal/envoyrun"
)

// newBenchCmd groups the project's measurements, one subcommand each.
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure inferlb components",
	}
	cmd.AddCommand(newBenchExtprocCmd(), newNullExtprocCmd(), newBenchAffinityCmd(), newBenchRivalsCmd(), newBenchSimRealCmd())
	return cmd
}

type extprocBench struct {
	duration    time.Duration
	concurrency []int
	sizes       []int
	envoy       bool
	protocol    bool
	conns       int
	childProf   string
	// envoyWorkers is Envoy's --concurrency in the Envoy comparison.
	envoyWorkers int
	// key is what keys the requests: "session" (an x-session-id header per
	// request) or "prefix" (none: the prompt's prefix chain).
	key string
	// binary is the ext_proc child's executable ("": this one), so that
	// two builds are measured by the same client.
	binary string
	// settle is how long after each cell the protocol benchmark waits
	// before it reads the child's resident set again.
	settle time.Duration
	// bodyMode is the frontend bootstrap's body mode
	// (envoyconfigs.BodyBuffered or BodyStreamed), in the Envoy comparison
	// and as the protocol client sends the body.
	bodyMode string
}

// session is request i of worker w's x-session-id ("" when keyed by prefix).
func (b *extprocBench) session(w, i int) string {
	if b.key == "prefix" {
		return ""
	}
	return fmt.Sprintf("w%d-%d", w, i)
}

func newBenchExtprocCmd() *cobra.Command {
	var (
		b            extprocBench
		conc, sizes  string
		envoyOnly    bool
		protocolOnly bool
	)
	cmd := &cobra.Command{
		Use:   "extproc",
		Short: "Benchmark the ext_proc service alone (as Envoy's client) and behind a real Envoy",
		Long: `bench extproc measures the ext_proc service in two ways, in one run:

1. Protocol: the service runs as a child process; this command plays Envoy's
   role over the ext_proc gRPC protocol (per request, as the frontend
   bootstrap has Envoy 1.40 send them: the request headers, then the body
   in one message after the headers' answer; --body-mode streamed: the
   body at once, without waiting for the headers' answer, in one chunk and
   an empty last one) at each concurrency and body size, and
   reports decisions/s, latency per decision (whole ext_proc stream) and the
   service's CPU per decision (from /proc of the child).

2. Envoy (needs the Envoy of scripts/setup.sh): side by side, Envoy alone
   (proxying straight to an upstream) and Envoy with the ext_proc filter and
   the envoy-configs frontend bootstrap, same upstream, same load: added
   p50/p99 latency and the throughput ratio.

Chat bodies are OpenAI chat/completions JSON of the given sizes with distinct
conversations. The upstream answers at once, so what is measured is the
balancer's own cost. docs/results/extproc-bench.md has the figures of
--duration 3s --concurrency 1,16,150 --sizes 8192,225280 (a few minutes).`,
		Example: `  inferlb-lab bench extproc --duration 1s --concurrency 16 --sizes 8192`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if b.concurrency, err = parseInts(conc, "--concurrency"); err != nil {
				return err
			}
			if b.sizes, err = parseInts(sizes, "--sizes"); err != nil {
				return err
			}
			if b.duration <= 0 {
				return fmt.Errorf("--duration must be positive")
			}
			if b.key != "session" && b.key != "prefix" {
				return fmt.Errorf("--key: want session or prefix, got %q", b.key)
			}
			if b.bodyMode != envoyconfigs.BodyStreamed && b.bodyMode != envoyconfigs.BodyBuffered {
				return fmt.Errorf("--body-mode: want %s or %s, got %q", envoyconfigs.BodyBuffered, envoyconfigs.BodyStreamed, b.bodyMode)
			}
			if b.settle < 0 {
				return fmt.Errorf("--settle must not be negative, got %v", b.settle)
			}
			if b.envoyWorkers < 1 {
				return fmt.Errorf("--envoy-workers must be at least 1, got %d", b.envoyWorkers)
			}
			if envoyOnly && protocolOnly {
				return fmt.Errorf("--envoy-only and --protocol-only exclude each other")
			}
			b.protocol, b.envoy = !envoyOnly, !protocolOnly
			return b.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&b.duration, "duration", 3*time.Second, "measuring time per cell")
	f.StringVar(&conc, "concurrency", "1,16,150", "concurrent requests, comma-separated")
	f.StringVar(&sizes, "sizes", "8192,225280", "chat body sizes in bytes, comma-separated")
	f.StringVar(&b.key, "key", "session", "what keys the protocol benchmark's requests: session (an x-session-id header) or prefix (none: the prompt's prefix chain and the heavy-hitter sketch)")
	f.StringVar(&b.bodyMode, "body-mode", envoyconfigs.BodyBuffered, "the frontend bootstrap's body mode, in the Envoy comparison and as the protocol client sends bodies: buffered (one message after the headers' answer) or streamed (chunks sent without waiting for the headers' answer, which carries the decision; older builds without streamed bodies serve buffered only)")
	f.IntVar(&b.conns, "conns", 2, "gRPC connections of the protocol client (Envoy opens one per worker)")
	f.IntVar(&b.envoyWorkers, "envoy-workers", runtime.NumCPU(), "Envoy worker threads (--concurrency) in the Envoy comparison; Envoy's own default is one per CPU")
	f.BoolVar(&envoyOnly, "envoy-only", false, "only the Envoy side-by-side comparison")
	f.BoolVar(&protocolOnly, "protocol-only", false, "only the protocol benchmark")
	f.StringVar(&b.childProf, "child-cpu-profile", "", "write the ext_proc child's CPU profile to this file")
	_ = f.MarkHidden("child-cpu-profile")
	f.DurationVar(&b.settle, "settle", 15*time.Second, "after each protocol cell, how long the service is left idle before its resident set is read again (RSS after)")
	f.StringVar(&b.binary, "extproc-binary", "", "inferlb executable to run as the ext_proc service (default: this one), to compare two builds with the same client")
	return cmd
}

func parseInts(s, flag string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", flag, p)
		}
		out = append(out, n)
	}
	return out, nil
}

const benchNode = "bench-frontend"

func benchPolicy() *policyv1.RoutingPolicy {
	return &policyv1.RoutingPolicy{
		NodeId: benchNode, Region: "local", Version: "bench",
		Priorities:      []*policyv1.Priority{{Name: "interactive", Level: 0}, {Name: "batch", Level: 1}},
		DefaultPriority: "interactive",
		Classes: []*policyv1.ClassPolicy{{Name: "llama", Cluster: benchCluster, Model: "llama-3-8b",
			RetryBudgetFraction: 0.1, MaxRetries: 1}},
	}
}

// chatBodies returns n distinct chat bodies of about size bytes.
func chatBodies(size, n int) [][]byte {
	words := []string{"the", "model", "serves", "tokens", "quickly", "while", "cache", "blocks", "stay", "warm", "across", "turns"}
	out := make([][]byte, n)
	for k := 0; k < n; k++ {
		var sb strings.Builder
		fmt.Fprintf(&sb, "conversation %d: ", k)
		for i := 0; sb.Len() < size-220; i++ {
			sb.WriteString(words[(i*7+k)%len(words)])
			sb.WriteByte(' ')
		}
		out[k] = []byte(fmt.Sprintf(`{"model":"llama-3-8b","stream":true,"max_tokens":128,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":%q}]}`, sb.String()))
	}
	return out
}

// child is the ext_proc service in its own process.
type child struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{}
}

func startExtProcChild(ctx context.Context, dir string, bodyLimit int, controlPlane, cpuProfile, binary, httpListen string) (*child, error) {
	pf := filepath.Join(dir, "policy.json")
	pj, _ := protojson.Marshal(benchPolicy())
	if err := os.WriteFile(pf, pj, 0o644); err != nil {
		return nil, err
	}
	port, err := envoyrun.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// The protocol benchmark plays Envoy without its access log, so no
	// admitted request's end is ever reported: a short age keeps the
	// service's request table small.
	args := []string{"extproc", "--listen", addr, "--http-listen", httpListen, "--policy-file", pf, "--log-level", "warn",
		"--body-limit", strconv.Itoa(bodyLimit), "--max-request-age", "10s"}
	if controlPlane != "" {
		args = append(args, "--control-plane", controlPlane, "--node-id", benchNode, "--insecure")
	}
	if cpuProfile != "" {
		args = append(args, "--cpu-profile", cpuProfile)
	}
	return startChild(ctx, binary, addr, args...)
}

// startChild runs binary ("": this executable) with args as a child
// process serving on addr, and waits until addr accepts connections.
func startChild(ctx context.Context, binary, addr string, args ...string) (*child, error) {
	if binary == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		binary = self
	}
	cmd := exec.Command(binary, args...)
	cmd.Stderr = os.Stderr
	c, err := startProc(ctx, cmd, addr)
	if err != nil {
		return nil, fmt.Errorf("%s child: %w", args[0], err)
	}
	return c, nil
}

// startProc starts cmd and waits until addr accepts connections (or the
// process exits, or ctx ends).
func startProc(ctx context.Context, cmd *exec.Cmd, addr string) (*child, error) {
	c := &child{cmd: cmd, addr: addr, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	if err := waitTCP(ctx, addr, c.done); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// cpuSeconds returns user+system CPU of a process from /proc.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(s[i+2:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name, want ≥ 13", pid, len(fields))
	}
	// fields[0] is state (field 3); utime is field 14, stime 15.
	ut, err := strconv.ParseFloat(fields[11], 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat utime: %w", pid, err)
	}
	st, err := strconv.ParseFloat(fields[12], 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat stime: %w", pid, err)
	}
	return (ut + st) / 100, nil // USER_HZ is 100 on Linux
}

// cpuReader reads CPU times and keeps the first error, so a table of
// figures is not printed from a failed read (0 CPU seconds: a silently
// wrong, even negative, CPU per request).
type cpuReader struct{ err error }

func (r *cpuReader) seconds(pid int) float64 {
	v, err := cpuSeconds(pid)
	if err != nil && r.err == nil {
		r.err = err
	}
	return v
}

func waitTCP(ctx context.Context, addr string, died <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-died:
			return errors.New("process exited")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
	return fmt.Errorf("%s not accepting connections after 20s", addr)
}

// latencies collects durations for percentiles.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) pct(p float64) time.Duration {
	if len(l.d) == 0 {
		return 0
	}
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	return l.d[min(len(l.d)-1, int(p*float64(len(l.d))))]
}

// closedLoop runs conc workers calling f until d has passed; it returns the
// number of successful calls, errors and latencies.
func closedLoop(ctx context.Context, conc int, d time.Duration, f func(worker, i int) error) (ok, bad int64, lat *latencies, firstErr error) {
	lat = &latencies{}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	var errOnce sync.Once
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				t0 := time.Now()
				if err := f(w, i); err != nil {
					if ctx.Err() != nil {
						return
					}
					atomic.AddInt64(&bad, 1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				lat.add(time.Since(t0))
				atomic.AddInt64(&ok, 1)
			}
		}()
	}
	wg.Wait()
	return ok, bad, lat, firstErr
}

func (b *extprocBench) run(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "inferlb-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	maxSize := 0
	for _, s := range b.sizes {
		maxSize = max(maxSize, s)
	}
	bodyLimit := max(extproc.DefaultBodyLimit, maxSize+4096)
	if b.protocol {
		if err := b.runProtocol(ctx, out, dir, bodyLimit); err != nil {
			return err
		}
	}
	if b.envoy {
		if err := b.runEnvoy(ctx, out, dir, bodyLimit); err != nil {
			return err
		}
	}
	return nil
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// decide plays Envoy for one request over one ext_proc stream, its body
// streamed or buffered.
func decide(ctx context.Context, c extprocv3.ExternalProcessorClient, body []byte, session string, streamed bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return err
	}
	hdrs := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		hv(":method", "POST"), hv(":path", "/v1/chat/completions"),
		hv("content-length", strconv.Itoa(len(body))),
	}}
	if session != "" {
		hdrs.Headers = append(hdrs.Headers, hv("x-session-id", session))
	}
	if streamed {
		return decideStreamed(st, hdrs, body)
	}
	// As Envoy 1.40 sends it: with an empty metadata_context and, on a
	// request's first message, the protocol configuration.
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}, MetadataContext: &corev3.Metadata{}, ProtocolConfig: bufferedConfig}); err != nil {
		return err
	}
	if _, err := st.Recv(); err != nil {
		return err
	}
	// As Envoy 1.40 sends it: with an empty metadata_context.
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}, MetadataContext: &corev3.Metadata{}}); err != nil {
		return err
	}
	r, err := st.Recv()
	if err != nil {
		return err
	}
	if r.GetRequestBody().GetResponse().GetHeaderMutation() == nil {
		return fmt.Errorf("no routing decision: %v", r)
	}
	// The service ends the stream with its decision (Envoy then goes on
	// without it); the request's end reaches it through Envoy's access log.
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("stream end after the decision: %v", err)
	}
	return nil
}

// decideStreamed sends the request as Envoy 1.40 does with the frontend
// bootstrap's streamed body mode (STREAMED,
// send_body_without_waiting_for_header_response): the
// headers with the protocol configuration, then at once the body in one
// chunk and an empty last one (the chunking Envoy's HTTP/1 path gives a
// body that arrived whole). The service answers the headers with its
// decision once the body is whole (its declared length: it need not wait
// for the empty chunk), then the chunk, and ends the stream.
func decideStreamed(st extprocv3.ExternalProcessor_ProcessClient, hdrs *corev3.HeaderMap, body []byte) error {
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}, MetadataContext: &corev3.Metadata{},
		ProtocolConfig: streamedConfig}); err != nil {
		return err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body}}, MetadataContext: &corev3.Metadata{}}); err != nil {
		return err
	}
	// Envoy's empty last chunk may reach a stream the service has already
	// ended: its error is the stream's end, read below.
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{EndOfStream: true}}, MetadataContext: &corev3.Metadata{}})
	r, err := st.Recv()
	if err != nil {
		return err
	}
	if r.GetRequestHeaders().GetResponse().GetHeaderMutation() == nil {
		return fmt.Errorf("no routing decision in the headers' answer: %v", r)
	}
	if r, err = st.Recv(); err != nil || r.GetRequestBody() == nil {
		return fmt.Errorf("the chunk's answer: %v %v", r, err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("stream end after the decision: %v", err)
	}
	return nil
}

// streamedConfig and bufferedConfig are the protocol configurations Envoy
// sends with each request's first message under the bootstrap's body modes.
var (
	streamedConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_STREAMED,
		SendBodyWithoutWaitingForHeaderResponse: true}
	bufferedConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}
)

func (b *extprocBench) runProtocol(ctx context.Context, out io.Writer, dir string, bodyLimit int) error {
	hport, err := envoyrun.FreePort()
	if err != nil {
		return err
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", hport)
	ch, err := startExtProcChild(ctx, dir, bodyLimit, "", b.childProf, b.binary, httpAddr)
	if err != nil {
		return err
	}
	defer ch.stop()
	pid := ch.cmd.Process.Pid
	var clients []extprocv3.ExternalProcessorClient
	for i := 0; i < max(1, b.conns); i++ {
		conn, err := grpc.NewClient(ch.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(bodyLimit+(1<<20))))
		if err != nil {
			return err
		}
		defer conn.Close()
		clients = append(clients, extprocv3.NewExternalProcessorClient(conn))
	}
	fmt.Fprintf(out, "ext_proc service alone (child pid %d), client playing Envoy over gRPC (%d connections, bodies %s), %v per cell; RSS after: %v idle after the cell\n",
		pid, len(clients), b.bodyMode, b.duration, b.settle)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "body\tconcurrency\tdecisions/s\tp50 ms\tp99 ms\tCPU ms/decision\tservice cores\tpeak RSS MB\tRSS after MB\theap MB\talloc KB/decision\terrors\t")
	for _, size := range b.sizes {
		bodies := chatBodies(size, 64)
		// Warm up (connections, allocator, JIT-free but caches).
		_, _, _, _ = closedLoop(ctx, 4, 300*time.Millisecond, func(w, i int) error {
			return decide(ctx, clients[w%len(clients)], bodies[i%len(bodies)], b.session(w, i), b.bodyMode == envoyconfigs.BodyStreamed)
		})
		for _, c := range b.concurrency {
			var cr cpuReader
			if err := resetPeakRSS(pid); err != nil {
				return fmt.Errorf("ext_proc child's peak RSS: %w", err)
			}
			m0, err := scrapeGoMemory(ctx, httpAddr)
			if err != nil {
				return err
			}
			cpu0 := cr.seconds(pid)
			t0 := time.Now()
			ok, bad, lat, ferr := closedLoop(ctx, c, b.duration, func(w, i int) error {
				return decide(ctx, clients[w%len(clients)], bodies[(w*131+i)%len(bodies)], b.session(w, i), b.bodyMode == envoyconfigs.BodyStreamed)
			})
			el := time.Since(t0).Seconds()
			cpu1 := cr.seconds(pid)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if cr.err != nil {
				return fmt.Errorf("ext_proc child's CPU time: %w", cr.err)
			}
			if ok == 0 {
				return fmt.Errorf("no decision succeeded: %v", ferr)
			}
			mem, err := b.cellMemory(ctx, pid, httpAddr, m0, ok)
			if err != nil {
				return err
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.3f\t%.3f\t%.4f\t%.2f\t%.0f\t%.0f\t%.0f\t%.1f\t%d\t\n", sizeName(size), c, float64(ok)/el,
				ms(lat.pct(0.5)), ms(lat.pct(0.99)), (cpu1-cpu0)*1000/float64(ok), (cpu1-cpu0)/el,
				mb(mem.peakRSS), mb(mem.afterRSS), mb(mem.heap), mem.allocPerDecision/1024, bad)
			if ferr != nil {
				fmt.Fprintf(out, "  first error: %v\n", ferr)
			}
		}
	}
	return tw.Flush()
}

// cellMemory reads the child's memory after a cell of ok decisions that
// began with the Go figures m0: the peak resident set during the cell, the
// heap in use at its end, the bytes allocated per decision, and the
// resident set once the child has been idle for b.settle.
func (b *extprocBench) cellMemory(ctx context.Context, pid int, httpAddr string, m0 goMemory, ok int64) (cellMemory, error) {
	var out cellMemory
	peak, err := procStatusKB(pid, "VmHWM")
	if err != nil {
		return out, err
	}
	m1, err := scrapeGoMemory(ctx, httpAddr)
	if err != nil {
		return out, err
	}
	select {
	case <-ctx.Done():
		return out, ctx.Err()
	case <-time.After(b.settle):
	}
	after, err := procStatusKB(pid, "VmRSS")
	if err != nil {
		return out, err
	}
	out.peakRSS, out.afterRSS, out.heap = peak<<10, after<<10, int64(m1.heapInuse)
	out.allocPerDecision = (m1.allocTotal - m0.allocTotal) / float64(ok)
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
