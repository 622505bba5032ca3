package main

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
	"github.com/inferlb/inferlb/internal/loadgen"
	"github.com/inferlb/inferlb/internal/workload"
)

func init() { rootCmd.AddCommand(newLoadgenCmd()) }

// newLoadgenCmd builds the loadgen command with its own flag set.
func newLoadgenCmd() *cobra.Command {
	var (
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
	)
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
		Example: `  inferlb loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 \
      --workload mooncake --trace internal/workload/testdata/mooncake_head.jsonl --block-tokens 16 --speedup 20
  inferlb loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 \
      --workload multiturn --arrival poisson --rate 2 --duration 40s \
      --priority-mix critical=1,batch=3 --region-url eu-west=http://127.0.0.1:17012 \
      --region-shares us-east=0.5,eu-west=0.5 --region-shares 20s:us-east=0.1,eu-west=0.9 \
      --slo-ttft 500ms --slo-tpot 50ms --json-out report.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if baseURL == "" {
				return fmt.Errorf("--url is required")
			}
			if err := checkURL(baseURL); err != nil {
				return fmt.Errorf("--url: %w", err)
			}
			if modelName == "" {
				return fmt.Errorf("--model is required")
			}
			// The library reads 0 as "use the default"; on the command line
			// a 0 is a value the user typed, not an omission.
			if !(timeScale > 0) {
				return fmt.Errorf("--time-scale: must be > 0, got %v", timeScale)
			}
			if !(speedup > 0) {
				return fmt.Errorf("--speedup: must be > 0, got %v", speedup)
			}
			if blockTokens < 1 {
				return fmt.Errorf("--block-tokens: must be at least 1, got %d", blockTokens)
			}
			if maxConns < 1 {
				return fmt.Errorf("--max-conns: must be at least 1, got %d", maxConns)
			}
			f, err := workload.ParseFormat(format)
			if err != nil {
				return fmt.Errorf("--format: %w", err)
			}
			var src workload.Source
			var mooncakeRows []workload.MooncakeRow
			switch wl {
			case "mooncake":
				if tracePath == "" {
					return fmt.Errorf("--workload mooncake needs --trace FILE")
				}
				rows, err := workload.LoadMooncake(tracePath)
				if err != nil {
					return err
				}
				mooncakeRows = rows
				if src, err = workload.NewMooncake(rows, workload.MooncakeOptions{Format: f, BlockTokens: blockTokens, MaxOutputTokens: maxOutput, Seed: seed}); err != nil {
					return err
				}
			case "azure":
				if tracePath == "" {
					return fmt.Errorf("--workload azure needs --trace FILE")
				}
				rows, err := workload.LoadAzure(tracePath)
				if err != nil {
					return err
				}
				if src, err = workload.NewAzure(rows, workload.AzureOptions{Format: f, Seed: seed}); err != nil {
					return err
				}
			case "multiturn":
				if tracePath != "" {
					return fmt.Errorf("--trace does not apply to --workload multiturn")
				}
				opt := workload.MultiTurnOptions{Format: f, SystemPrompts: systemPrompts, SystemPromptTokens: systemPromptTokens,
					ThinkTime: thinkTime, SessionIDs: sessionIDs, Seed: seed}
				for _, x := range []struct {
					flag string
					s    string
					dst  *workload.Range
				}{{"--turns", turns, &opt.Turns}, {"--user-tokens", userTokens, &opt.UserTokens}, {"--output-tokens", outputTokens, &opt.OutputTokens}} {
					if *x.dst, err = workload.ParseRange(x.s); err != nil {
						return fmt.Errorf("%s: %w", x.flag, err)
					}
				}
				if priorityMix != "" {
					if opt.Priorities, err = workload.ParseShares(priorityMix); err != nil {
						return fmt.Errorf("--priority-mix: %w", err)
					}
				}
				for _, s := range regionShares {
					ph, err := workload.ParseRegionPhase(s)
					if err != nil {
						return fmt.Errorf("--region-shares: %w", err)
					}
					opt.Regions = append(opt.Regions, ph)
				}
				if src, err = workload.NewMultiTurn(opt); err != nil {
					return err
				}
			case "":
				return fmt.Errorf("--workload is required (mooncake, azure or multiturn)")
			default:
				return fmt.Errorf("--workload %q: want mooncake, azure or multiturn", wl)
			}
			if wl != "mooncake" && (cmd.Flags().Changed("block-tokens") || cmd.Flags().Changed("max-output-tokens")) {
				return fmt.Errorf("--block-tokens and --max-output-tokens apply to --workload mooncake")
			}

			if arrival == "" {
				if !src.Timed() {
					return fmt.Errorf("--workload %s has no timestamps: choose --arrival poisson (with --rate) or closed (with --concurrency)", wl)
				}
				arrival = "trace"
			}
			kind, err := loadgen.ParseArrival(arrival)
			if err != nil {
				return fmt.Errorf("--arrival: %w", err)
			}
			arr := loadgen.Arrival{Kind: kind, Rate: rate, Speedup: speedup, Concurrency: concurrency}
			if kind != loadgen.Poisson && (cmd.Flags().Changed("rate") || len(rateAt) > 0) {
				return fmt.Errorf("--rate and --rate-at apply to --arrival poisson")
			}
			if kind == loadgen.Poisson && !(rate > 0) {
				return fmt.Errorf("--rate: poisson arrivals need a rate > 0, got %v", rate)
			}
			for _, s := range rateAt {
				rc, err := loadgen.ParseRateChange(s)
				if err != nil {
					return fmt.Errorf("--rate-at: %w", err)
				}
				if n := len(arr.RateChanges); n > 0 && rc.At <= arr.RateChanges[n-1].At {
					return fmt.Errorf("--rate-at %q: times must increase (after %v)", s, arr.RateChanges[n-1].At)
				}
				arr.RateChanges = append(arr.RateChanges, rc)
			}
			if kind != loadgen.Trace && cmd.Flags().Changed("speedup") {
				return fmt.Errorf("--speedup applies to --arrival trace")
			}
			if kind != loadgen.Closed && cmd.Flags().Changed("concurrency") {
				return fmt.Errorf("--concurrency applies to --arrival closed")
			}

			hn := loadgen.HeaderNames{Session: sessionHeader, Priority: priorityHeader}
			if directEngine {
				hn.Region = regionHeader
			} else if cmd.Flags().Changed("region-header") {
				return fmt.Errorf("--region-header applies with --direct-engine (behind inferlb the frontend sets the region)")
			}
			client := &loadgen.Client{HTTP: loadgen.NewHTTPClient(maxConns), MaxIdleConns: maxConns, BaseURL: baseURL, Model: modelName,
				Headers: hn, IgnoreEOS: ignoreEOS, Timeout: timeout, ExtraHeaders: http.Header{}}
			if len(regionURLs) > 0 {
				client.RegionURLs = map[string]string{}
				for _, s := range regionURLs {
					region, u, ok := strings.Cut(s, "=")
					if !ok || region == "" {
						return fmt.Errorf("--region-url %q: want REGION=URL", s)
					}
					if err := checkURL(u); err != nil {
						return fmt.Errorf("--region-url %q: %w", s, err)
					}
					client.RegionURLs[region] = u
				}
			}
			for _, h := range extraHeaders {
				k, v, ok := strings.Cut(h, ":")
				if !ok || strings.TrimSpace(k) == "" {
					return fmt.Errorf("--header %q: want \"Name: value\"", h)
				}
				client.ExtraHeaders.Add(strings.TrimSpace(k), strings.TrimSpace(v))
			}
			if maxRequests == 0 && duration == 0 && !src.Timed() && !forever {
				return fmt.Errorf("--workload %s is endless: bound it with --max-requests or --duration, or run it with --until-interrupted", wl)
			}
			cfg := loadgen.Config{Client: client, Source: src, Arrival: arr, MaxRequests: maxRequests, Duration: duration, UntilCancelled: forever,
				SLO: loadgen.SLO{TTFT: sloTTFT, TPOT: sloTPOT}, Seed: seed, TimeScale: timeScale}
			if progress {
				cfg.Progress = cmd.ErrOrStderr()
			}
			var closeLog func() error
			if requestsOut != "" {
				f, err := os.Create(requestsOut)
				if err != nil {
					return fmt.Errorf("--requests-out: %w", err)
				}
				bw := bufio.NewWriter(f)
				enc := json.NewEncoder(bw)
				var mu sync.Mutex
				var start time.Time
				cfg.OnStart = func(t time.Time) { start = t } // before any OnResult
				cfg.OnResult = func(req *workload.Request, res *loadgen.Result) {
					mu.Lock()
					defer mu.Unlock()
					enc.Encode(loadgen.Record(req, res, start, timeScale))
					// Flushed per record: a live reader (the demo's view)
					// tails this file.
					bw.Flush()
				}
				closeLog = func() error {
					if err := bw.Flush(); err != nil {
						f.Close()
						return err
					}
					return f.Close()
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
				ideal := workload.MooncakeIdeal(mooncakeRows[:n], blockTokens)
				rep.IdealCachedShare, rep.IdealBlockShare = ideal.TokenShare(), ideal.BlockShare()
			}
			if err := rep.WriteTable(cmd.OutOrStdout()); err != nil {
				return err
			}
			if jsonOut != "" {
				if err := rep.WriteJSONFile(jsonOut); err != nil {
					return fmt.Errorf("--json-out: %w", err)
				}
			}
			if rep.Interrupted && !forever {
				return fmt.Errorf("interrupted; the report covers the requests that finished")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&baseURL, "url", "", "base URL of the OpenAI-compatible server (required), e.g. http://127.0.0.1:10000")
	fl.StringArrayVar(&regionURLs, "region-url", nil, "REGION=URL: send requests of a source region to that region's frontend (repeatable; others go to --url)")
	fl.StringVar(&modelName, "model", "", "model name sent in every request (required)")
	fl.StringVar(&wl, "workload", "", "mooncake, azure or multiturn (required)")
	fl.StringVar(&tracePath, "trace", "", "trace file for mooncake (JSONL) and azure (CSV)")
	fl.StringVar(&format, "format", "chat", "prompt format: chat (/v1/chat/completions) or completion (/v1/completions)")
	fl.IntVar(&blockTokens, "block-tokens", 512, "mooncake: tokens per hash id (below 512 shrinks prompts, keeping the prefix structure)")
	fl.IntVar(&maxOutput, "max-output-tokens", 0, "mooncake: cap on output tokens (0: the trace's)")
	fl.StringVar(&arrival, "arrival", "", "trace, poisson or closed (default trace for trace workloads)")
	fl.Float64Var(&rate, "rate", 0, "poisson: new requests (sessions, for multiturn) per second")
	fl.StringArrayVar(&rateAt, "rate-at", nil, "poisson: AT:RATE, the rate from AT on (repeatable, times increasing), e.g. 120s:12 then 180s:4")
	fl.BoolVar(&forever, "until-interrupted", false, "allow a run with no bound: send until SIGINT/SIGTERM, then report (exit 0)")
	fl.Float64Var(&speedup, "speedup", 1, "trace: replay this many times faster than the trace's timestamps")
	fl.IntVar(&concurrency, "concurrency", 0, "closed: requests in flight")
	fl.IntVar(&maxRequests, "max-requests", 0, "stop after this many requests, follow-up turns included (0: no bound)")
	fl.DurationVar(&duration, "duration", 0, "send no request after this long (0: no bound); requests in flight finish")
	fl.DurationVar(&timeout, "timeout", 5*time.Minute, "per-request bound from send to the end of the stream (0: none)")
	fl.DurationVar(&sloTTFT, "slo-ttft", 0, "goodput: TTFT bound (0: not checked)")
	fl.DurationVar(&sloTPOT, "slo-tpot", 0, "goodput: TPOT bound (0: not checked)")
	fl.Float64Var(&timeScale, "time-scale", 1, "the target's time scale (engine-sim --time-scale): trace times, --rate, --think-time, --duration, the SLOs and the report are in its simulated time (--timeout stays real)")
	fl.StringVar(&jsonOut, "json-out", "", "also write the report as JSON to this file")
	fl.StringVar(&requestsOut, "requests-out", "", "also write one JSON line per request (timings, tokens, outcome) to this file")
	fl.BoolVar(&progress, "progress", true, "print a progress line to stderr every second")
	fl.Uint64Var(&seed, "seed", 1, "seed for prompt text, sessions and Poisson arrivals")
	fl.BoolVar(&ignoreEOS, "ignore-eos", true, `send vLLM's "ignore_eos": true, so outputs have exactly max_tokens tokens`)
	fl.IntVar(&maxConns, "max-conns", 4096, "idle keep-alive connections kept per host")
	fl.StringArrayVar(&extraHeaders, "header", nil, `extra request header "Name: value" (repeatable)`)
	fl.StringVar(&sessionHeader, "session-header", headers.SessionID, "header carrying a session id (empty: none)")
	fl.StringVar(&priorityHeader, "priority-header", headers.Priority, "header carrying a request's priority (empty: none)")
	fl.BoolVar(&directEngine, "direct-engine", false, "the target is an engine, not inferlb: send each request's source region in --region-header (the engine simulator emulates the network distance from it)")
	fl.StringVar(&regionHeader, "region-header", headers.SourceRegion, "with --direct-engine: header carrying the source region")
	fl.IntVar(&systemPrompts, "system-prompts", 4, "multiturn: distinct system prompts shared by sessions")
	fl.IntVar(&systemPromptTokens, "system-prompt-tokens", 400, "multiturn: tokens per system prompt")
	fl.StringVar(&turns, "turns", "2-6", "multiturn: turns per session, N or MIN-MAX")
	fl.StringVar(&userTokens, "user-tokens", "50-200", "multiturn: tokens per user message, N or MIN-MAX")
	fl.StringVar(&outputTokens, "output-tokens", "50-200", "multiturn: max_tokens per answer, N or MIN-MAX")
	fl.DurationVar(&thinkTime, "think-time", time.Second, "multiturn: mean (exponential) wait between an answer and the next turn")
	fl.BoolVar(&sessionIDs, "session-ids", true, "multiturn: send each session's id in --session-header")
	fl.StringVar(&priorityMix, "priority-mix", "", "multiturn: priorities' shares of sessions, e.g. high=1,low=3 (empty: no priority)")
	fl.StringArrayVar(&regionShares, "region-shares", nil, "multiturn: [AT:]region=w,... regions' shares of new sessions from AT on (repeatable; the first starts at 0s), e.g. us=0.5,eu=0.5 then 60s:us=0.1,eu=0.9")
	return cmd
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
