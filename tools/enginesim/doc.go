// Package enginesim serves simulated LLM inference engines that look like a
// vLLM OpenAI-compatible server from the outside, as far as a load balancer
// can see: the same endpoints, SSE stream, usage block, error JSON and
// Prometheus metric names, and latencies that follow a GPU profile under load
// (continuous batching, chunked prefill, prefix cache; see package model for
// the scheduler core, which this package drives in real time).
//
// # Go API (for tests of other components)
//
// Start one engine on an ephemeral loopback port:
//
//	srv, err := enginesim.Start(ctx, enginesim.Options{
//		Model:     "llama-3.1-8b",
//		Profile:   enginesim.H100Llama8B, // or a fleet.Profile from a spec
//		TimeScale: 0.1,                   // run 10× faster than real time
//	})
//	defer srv.Close()
//	resp, err := http.Post(srv.URL()+"/v1/chat/completions", ...)
//
// or every engine of a fleet spec (each on its own port; AnyPort picks free
// loopback ports instead of the spec's addresses):
//
//	fl, err := enginesim.StartFleet(ctx, spec, enginesim.FleetOptions{AnyPort: true, TimeScale: 0.1})
//	defer fl.Close()
//	url := fl.Server("h100-us-east-0").URL()
//
// Faults are set with Server.SetFaults, or over HTTP on an admin listener of
// their own (AdminHandler, ServeAdmin; never on an engine's API port);
// Server.Restart brings a crashed engine back. Servers stop when ctx is cancelled or on Close.
//
// # Endpoints
//
//	POST /v1/chat/completions, /v1/completions   streaming (SSE) or not
//	GET  /v1/models, /health, /metrics
//
// and what routers in front of vLLM or SGLang ask an engine (served in
// either server kind, since SGLang routers ask any worker):
//
//	POST /tokenize                          vLLM's: prompt or messages → {count, max_model_len, tokens, token_strs}
//	POST /v1/chat/completions/render        vLLM's GenerateRequest: token_ids, sampling_params, ...
//	POST /v1/completions/render             a list of one GenerateRequest
//	GET  /version                           vLLM's {"version": ...}
//	GET  /get_server_info, /server_info     SGLang's server arguments and limits
//	GET  /get_model_info, /model_info       SGLang's model info
//	GET  /v1/loads, /loads                  SGLang's load report: the scheduler's requests and tokens now
//
// Token ids there follow the token rule the engine's prefix cache uses (a
// chat prompt as the chat completion tokenizes it), each id reduced modulo
// VocabSize, so equal prefixes give equal id prefixes on every engine.
//
// On the admin listener:
//
//	GET|POST|DELETE /admin/engines/{id}/faults    {error_rate, slowdown, hang, health_fail, crash, restart_after_s}
//
// # Simulation rules
//
//   - Output length: exactly max_completion_tokens, else max_tokens, tokens
//     (finish_reason "length", as with ignore_eos); when neither is given,
//     Options.DefaultMaxTokens (default 128) capped by the context limit,
//     reported as finish_reason "stop" (as if the model emitted EOS).
//   - Text: deterministic words of 2–7 letters, one token each under the
//     project's token rule (package tokens), separated by single spaces.
//   - Time: all durations of the profile are simulated time; TimeScale s
//     makes a simulated second last s real seconds. /metrics is in real
//     time, as a real engine's: latency histograms in real seconds (the
//     simulated ones times s), and its counters are read per real second,
//     so a control plane reading it sees one time base and plans with the
//     fleet in real time (fleet.Spec.InRealTime, control-plane
//     --time-scale).
//   - Network distance: a request carrying x-inferlb-source-region is held
//     for the fleet's round trip between that region and the engine's region
//     before it reaches the engine (scaled by TimeScale). No header, or no
//     fleet network configured: no delay. An unknown region is a 400.
//   - Crash closes the listener and drops every connection; the engine stays
//     down until Server.Restart, or restart_after_s simulated seconds if
//     given. A restarted engine has an empty prefix cache and fresh counters,
//     like a restarted vLLM process.
package enginesim
