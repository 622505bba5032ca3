package labcmd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// newLoadgenCmd builds the loadgen command with its own flag set.
func newLoadgenCmd() *cobra.Command {
	var l loadgenFlags
	cmd := &cobra.Command{
		Use:   "loadgen",
		Short: "Send an LLM workload to an OpenAI-compatible endpoint and measure it",
		Long: `loadgen is an LLM-aware load generator. It streams OpenAI-compatible
requests (/v1/chat/completions or /v1/completions, SSE, with
stream_options.include_usage) to any base URL — an inferlb Envoy frontend, an
engine, a real vLLM — and measures them as inference-perf defines its metrics:
TTFT, TPOT, ITL, end-to-end latency, request and token throughput, SLO goodput,
errors, 429s and timeouts apart, and the share of prompt tokens the engine
served from its prefix cache. See docs/loadgen.md.

Workloads (--workload):
  mooncake   replay a Mooncake JSONL trace: each hash id becomes a fixed block
             of text, so equal id prefixes are equal prompt prefixes
  azure      replay an Azure LLM inference CSV trace: its arrival times and sizes
  multiturn  synthetic chat sessions: shared system prompts, each turn appends
             the answer streamed for the last, think time, a priority mix and
             per-region demand shares that may change over time (a surge)

Arrivals (--arrival): trace (the trace's timestamps ÷ --speedup; the default
for trace workloads), poisson (--rate new requests per second) or closed
(--concurrency requests in flight). Runs end after --max-requests requests,
after --duration, or at the end of the trace, whichever comes first; with
--until-interrupted a run may have no bound and ends at SIGINT/SIGTERM, with
its report. --rate-at changes the Poisson rate during the run (a load phase).

The examples send to the frontends of a running demo (make demo: us-east on
127.0.0.1:17010, eu-west on :17012).`,
		Example: `  inferlb-lab loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 \
      --workload mooncake --trace tools/workload/testdata/mooncake_head.jsonl --block-tokens 16 --speedup 20
  inferlb-lab loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 \
      --workload multiturn --arrival poisson --rate 2 --duration 40s \
      --priority-mix critical=1,batch=3 --region-url eu-west=http://127.0.0.1:17012 \
      --region-shares us-east=0.5,eu-west=0.5 --region-shares 20s:us-east=0.1,eu-west=0.9 \
      --slo-ttft 500ms --slo-tpot 50ms --json-out report.json`,
		Args: cobra.NoArgs,
		RunE: l.run,
	}
	fl := cmd.Flags()
	fl.StringVar(&l.baseURL, "url", "", "base URL of the OpenAI-compatible server (required), e.g. http://127.0.0.1:10000")
	fl.StringArrayVar(&l.regionURLs, "region-url", nil, "REGION=URL: send requests of a source region to that region's frontend (repeatable; others go to --url)")
	fl.StringVar(&l.modelName, "model", "", "model name sent in every request (required)")
	fl.StringVar(&l.wl, "workload", "", "mooncake, azure or multiturn (required)")
	fl.StringVar(&l.tracePath, "trace", "", "trace file for mooncake (JSONL) and azure (CSV)")
	fl.StringVar(&l.format, "format", "chat", "prompt format: chat (/v1/chat/completions) or completion (/v1/completions)")
	fl.IntVar(&l.blockTokens, "block-tokens", 512, "mooncake: tokens per hash id (below 512 shrinks prompts, keeping the prefix structure)")
	fl.IntVar(&l.maxOutput, "max-output-tokens", 0, "mooncake: cap on output tokens (0: the trace's)")
	fl.StringVar(&l.arrival, "arrival", "", "trace, poisson or closed (default trace for trace workloads)")
	fl.Float64Var(&l.rate, "rate", 0, "poisson: new requests (sessions, for multiturn) per second")
	fl.StringArrayVar(&l.rateAt, "rate-at", nil, "poisson: AT:RATE, the rate from AT on (repeatable, times increasing), e.g. 120s:12 then 180s:4")
	fl.BoolVar(&l.forever, "until-interrupted", false, "allow a run with no bound: send until SIGINT/SIGTERM, then report (exit 0)")
	fl.Float64Var(&l.speedup, "speedup", 1, "trace: replay this many times faster than the trace's timestamps")
	fl.IntVar(&l.concurrency, "concurrency", 0, "closed: requests in flight")
	fl.IntVar(&l.maxRequests, "max-requests", 0, "stop after this many requests, follow-up turns included (0: no bound)")
	fl.DurationVar(&l.duration, "duration", 0, "send no request after this long (0: no bound); requests in flight finish")
	fl.DurationVar(&l.timeout, "timeout", 5*time.Minute, "per-request bound from send to the end of the stream (0: none)")
	fl.DurationVar(&l.sloTTFT, "slo-ttft", 0, "goodput: TTFT bound (0: not checked)")
	fl.DurationVar(&l.sloTPOT, "slo-tpot", 0, "goodput: TPOT bound (0: not checked)")
	fl.Float64Var(&l.timeScale, "time-scale", 1, "the target's time scale (engine-sim --time-scale): trace times, --rate, --think-time, --duration, the SLOs and the report are in its simulated time (--timeout stays real)")
	fl.StringVar(&l.jsonOut, "json-out", "", "also write the report as JSON to this file")
	fl.StringVar(&l.requestsOut, "requests-out", "", "also write one JSON line per request (timings, tokens, outcome) to this file")
	fl.BoolVar(&l.progress, "progress", true, "print a progress line to stderr every second")
	fl.Uint64Var(&l.seed, "seed", 1, "seed for prompt text, sessions and Poisson arrivals")
	fl.BoolVar(&l.ignoreEOS, "ignore-eos", true, `send vLLM's "ignore_eos": true, so outputs have exactly max_tokens tokens`)
	fl.IntVar(&l.maxConns, "max-conns", 4096, "idle keep-alive connections kept per host")
	fl.StringArrayVar(&l.extraHeaders, "header", nil, `extra request header "Name: value" (repeatable)`)
	fl.StringVar(&l.sessionHeader, "session-header", headers.SessionID, "header carrying a session id (empty: none)")
	fl.StringVar(&l.priorityHeader, "priority-header", headers.Priority, "header carrying a request's priority (empty: none)")
	fl.BoolVar(&l.directEngine, "direct-engine", false, "the target is an engine, not inferlb: send each request's source region in --region-header (the engine simulator emulates the network distance from it)")
	fl.StringVar(&l.regionHeader, "region-header", headers.SourceRegion, "with --direct-engine: header carrying the source region")
	fl.IntVar(&l.systemPrompts, "system-prompts", 4, "multiturn: distinct system prompts shared by sessions")
	fl.IntVar(&l.systemPromptTokens, "system-prompt-tokens", 400, "multiturn: tokens per system prompt")
	fl.StringVar(&l.turns, "turns", "2-6", "multiturn: turns per session, N or MIN-MAX")
	fl.StringVar(&l.userTokens, "user-tokens", "50-200", "multiturn: tokens per user message, N or MIN-MAX")
	fl.StringVar(&l.outputTokens, "output-tokens", "50-200", "multiturn: max_tokens per answer, N or MIN-MAX")
	fl.DurationVar(&l.thinkTime, "think-time", time.Second, "multiturn: mean (exponential) wait between an answer and the next turn")
	fl.BoolVar(&l.sessionIDs, "session-ids", true, "multiturn: send each session's id in --session-header")
	fl.StringVar(&l.priorityMix, "priority-mix", "", "multiturn: priorities' shares of sessions, e.g. high=1,low=3 (empty: no priority)")
	fl.StringArrayVar(&l.regionShares, "region-shares", nil, "multiturn: [AT:]region=w,... regions' shares of new sessions from AT on (repeatable; the first starts at 0s), e.g. us=0.5,eu=0.5 then 60s:us=0.1,eu=0.9")
	return cmd
}

// loadgenFlags are inferlb-lab loadgen's flags.
type loadgenFlags struct {
	baseURL, modelName, wl, tracePath, format, arrival, jsonOut string
	requestsOut                                                 string
	regionURLs, extraHeaders, regionShares, rateAt              []string
	sessionHeader, priorityHeader, regionHeader, priorityMix    string
	turns, userTokens, outputTokens                             string
	rate, speedup, timeScale                                    float64
	concurrency, maxRequests, blockTokens, maxOutput, maxConns  int
	systemPrompts, systemPromptTokens                           int
	duration, timeout, sloTTFT, sloTPOT, thinkTime              time.Duration
	seed                                                        uint64
	progress, ignoreEOS, directEngine, sessionIDs, forever      bool
}

func (l *loadgenFlags) run(cmd *cobra.Command, args []string) error {
	if l.baseURL == "" {
		return fmt.Errorf("--url is required")
	}
	if err := checkURL(l.baseURL); err != nil {
		return fmt.Errorf("--url: %w", err)
	}
	if l.modelName == "" {
		return fmt.Errorf("--model is required")
	}
	// The library reads 0 as "use the default"; on the command line
	// a 0 is a value the user typed, not an omission.
	if !(l.timeScale > 0) {
		return fmt.Errorf("--time-scale: must be > 0, got %v", l.timeScale)
	}
	if !(l.speedup > 0) {
		return fmt.Errorf("--speedup: must be > 0, got %v", l.speedup)
	}
	if l.blockTokens < 1 {
		return fmt.Errorf("--block-tokens: must be at least 1, got %d", l.blockTokens)
	}
	if l.maxConns < 1 {
		return fmt.Errorf("--max-conns: must be at least 1, got %d", l.maxConns)
	}
	src, mooncakeRows, err := l.source(cmd)
	if err != nil {
		return err
	}

	arr, err := l.arrivals(cmd, src)
	if err != nil {
		return err
	}

	client, err := l.client(cmd)
	if err != nil {
		return err
	}

	if l.maxRequests == 0 && l.duration == 0 && !src.Timed() && !l.forever {
		return fmt.Errorf("--workload %s is endless: bound it with --max-requests or --duration, or run it with --until-interrupted", l.wl)
	}
	cfg := loadgen.Config{Client: client, Source: src, Arrival: arr, MaxRequests: l.maxRequests, Duration: l.duration, UntilCancelled: l.forever,
		SLO: loadgen.SLO{TTFT: l.sloTTFT, TPOT: l.sloTPOT}, Seed: l.seed, TimeScale: l.timeScale}
	if l.progress {
		cfg.Progress = cmd.ErrOrStderr()
	}
	var closeLog func() error
	if l.requestsOut != "" {
		if closeLog, err = l.requestLog(&cfg); err != nil {
			return err
		}
	}
	rep, err := loadgen.Run(cmd.Context(), cfg)
	if closeLog != nil {
		if cerr := closeLog(); cerr != nil && err == nil {
			err = fmt.Errorf("--requests-out: %w", cerr)
		}
	}
	if err != nil {
		return err
	}
	if mooncakeRows != nil {
		// Rows are sent in trace order, so those sent are a prefix.
		n := min(rep.Requests.Sent, len(mooncakeRows))
		ideal := workload.MooncakeIdeal(mooncakeRows[:n], l.blockTokens)
		rep.IdealCachedShare, rep.IdealBlockShare = ideal.TokenShare(), ideal.BlockShare()
	}
	if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
		return err
	}
	if l.jsonOut != "" {
		if err := rep.WriteJSONFile(l.jsonOut); err != nil {
			return fmt.Errorf("--json-out: %w", err)
		}
	}
	if rep.Interrupted && !l.forever {
		return fmt.Errorf("interrupted; the report covers the requests that finished")
	}
	return nil
}

// source builds --workload's request source (and, for mooncake, the rows it
// replays, for the ideal cache figures).
func (l *loadgenFlags) source(cmd *cobra.Command) (src workload.Source, mooncakeRows []workload.MooncakeRow, err error) {
	f, err := workload.ParseFormat(l.format)
	if err != nil {
		return nil, nil, fmt.Errorf("--format: %w", err)
	}
	switch l.wl {
	case "mooncake":
		if l.tracePath == "" {
			return nil, nil, fmt.Errorf("--workload mooncake needs --trace FILE")
		}
		rows, err := workload.LoadMooncake(l.tracePath)
		if err != nil {
			return nil, nil, err
		}
		mooncakeRows = rows
		if src, err = workload.NewMooncake(rows, workload.MooncakeOptions{Format: f, BlockTokens: l.blockTokens, MaxOutputTokens: l.maxOutput, Seed: l.seed}); err != nil {
			return nil, nil, err
		}
	case "azure":
		if l.tracePath == "" {
			return nil, nil, fmt.Errorf("--workload azure needs --trace FILE")
		}
		rows, err := workload.LoadAzure(l.tracePath)
		if err != nil {
			return nil, nil, err
		}
		if src, err = workload.NewAzure(rows, workload.AzureOptions{Format: f, Seed: l.seed}); err != nil {
			return nil, nil, err
		}
	case "multiturn":
		if l.tracePath != "" {
			return nil, nil, fmt.Errorf("--trace does not apply to --workload multiturn")
		}
		opt := workload.MultiTurnOptions{Format: f, SystemPrompts: l.systemPrompts, SystemPromptTokens: l.systemPromptTokens,
			ThinkTime: l.thinkTime, SessionIDs: l.sessionIDs, Seed: l.seed}
		for _, x := range []struct {
			flag string
			s    string
			dst  *workload.Range
		}{{"--turns", l.turns, &opt.Turns}, {"--user-tokens", l.userTokens, &opt.UserTokens}, {"--output-tokens", l.outputTokens, &opt.OutputTokens}} {
			if *x.dst, err = workload.ParseRange(x.s); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", x.flag, err)
			}
		}
		if l.priorityMix != "" {
			if opt.Priorities, err = workload.ParseShares(l.priorityMix); err != nil {
				return nil, nil, fmt.Errorf("--priority-mix: %w", err)
			}
		}
		for _, s := range l.regionShares {
			ph, err := workload.ParseRegionPhase(s)
			if err != nil {
				return nil, nil, fmt.Errorf("--region-shares: %w", err)
			}
			opt.Regions = append(opt.Regions, ph)
		}
		if src, err = workload.NewMultiTurn(opt); err != nil {
			return nil, nil, err
		}
	case "":
		return nil, nil, fmt.Errorf("--workload is required (mooncake, azure or multiturn)")
	default:
		return nil, nil, fmt.Errorf("--workload %q: want mooncake, azure or multiturn", l.wl)
	}
	if l.wl != "mooncake" && (cmd.Flags().Changed("block-tokens") || cmd.Flags().Changed("max-output-tokens")) {
		return nil, nil, fmt.Errorf("--block-tokens and --max-output-tokens apply to --workload mooncake")
	}
	return src, mooncakeRows, nil
}

// arrivals builds the arrival process from --arrival and its flags.
func (l *loadgenFlags) arrivals(cmd *cobra.Command, src workload.Source) (loadgen.Arrival, error) {
	if l.arrival == "" {
		if !src.Timed() {
			return loadgen.Arrival{}, fmt.Errorf("--workload %s has no timestamps: choose --arrival poisson (with --rate) or closed (with --concurrency)", l.wl)
		}
		l.arrival = "trace"
	}
	kind, err := loadgen.ParseArrival(l.arrival)
	if err != nil {
		return loadgen.Arrival{}, fmt.Errorf("--arrival: %w", err)
	}
	arr := loadgen.Arrival{Kind: kind, Rate: l.rate, Speedup: l.speedup, Concurrency: l.concurrency}
	if kind != loadgen.Poisson && (cmd.Flags().Changed("rate") || len(l.rateAt) > 0) {
		return loadgen.Arrival{}, fmt.Errorf("--rate and --rate-at apply to --arrival poisson")
	}
	if kind == loadgen.Poisson && !(l.rate > 0) {
		return loadgen.Arrival{}, fmt.Errorf("--rate: poisson arrivals need a rate > 0, got %v", l.rate)
	}
	for _, s := range l.rateAt {
		rc, err := loadgen.ParseRateChange(s)
		if err != nil {
			return loadgen.Arrival{}, fmt.Errorf("--rate-at: %w", err)
		}
		if n := len(arr.RateChanges); n > 0 && rc.At <= arr.RateChanges[n-1].At {
			return loadgen.Arrival{}, fmt.Errorf("--rate-at %q: times must increase (after %v)", s, arr.RateChanges[n-1].At)
		}
		arr.RateChanges = append(arr.RateChanges, rc)
	}
	if kind != loadgen.Trace && cmd.Flags().Changed("speedup") {
		return loadgen.Arrival{}, fmt.Errorf("--speedup applies to --arrival trace")
	}
	if kind != loadgen.Closed && cmd.Flags().Changed("concurrency") {
		return loadgen.Arrival{}, fmt.Errorf("--concurrency applies to --arrival closed")
	}

	return arr, nil
}

// client builds the HTTP client from --url, --region-url, --header and the
// header-name flags.
func (l *loadgenFlags) client(cmd *cobra.Command) (*loadgen.Client, error) {
	hn := loadgen.HeaderNames{Session: l.sessionHeader, Priority: l.priorityHeader}
	if l.directEngine {
		hn.Region = l.regionHeader
	} else if cmd.Flags().Changed("region-header") {
		return nil, fmt.Errorf("--region-header applies with --direct-engine (behind inferlb the frontend sets the region)")
	}
	client := &loadgen.Client{HTTP: loadgen.NewHTTPClient(l.maxConns), MaxIdleConns: l.maxConns, BaseURL: l.baseURL, Model: l.modelName,
		Headers: hn, IgnoreEOS: l.ignoreEOS, Timeout: l.timeout, ExtraHeaders: http.Header{}}
	if len(l.regionURLs) > 0 {
		client.RegionURLs = map[string]string{}
		for _, s := range l.regionURLs {
			region, u, ok := strings.Cut(s, "=")
			if !ok || region == "" {
				return nil, fmt.Errorf("--region-url %q: want REGION=URL", s)
			}
			if err := checkURL(u); err != nil {
				return nil, fmt.Errorf("--region-url %q: %w", s, err)
			}
			client.RegionURLs[region] = u
		}
	}
	for _, h := range l.extraHeaders {
		k, v, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--header %q: want \"Name: value\"", h)
		}
		client.ExtraHeaders.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return client, nil
}

// requestLog makes cfg write every request's record to --requests-out; the
// function it returns flushes and closes the file.
func (l *loadgenFlags) requestLog(cfg *loadgen.Config) (closeLog func() error, err error) {
	f, err := os.Create(l.requestsOut)
	if err != nil {
		return nil, fmt.Errorf("--requests-out: %w", err)
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	var mu sync.Mutex
	var start time.Time
	cfg.OnStart = func(t time.Time) { start = t } // before any OnResult
	cfg.OnResult = func(req *workload.Request, res *loadgen.Result) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(loadgen.Record(req, res, start, l.timeScale))
		// Flushed per record: a live reader (the demo's view)
		// tails this file.
		bw.Flush()
	}
	return func() error {
		if err := bw.Flush(); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}, nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http(s)://host[:port] URL", s)
	}
	return nil
}
