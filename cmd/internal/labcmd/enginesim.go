package labcmd

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/cliconfig"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/spf13/cobra"
)

// profileFlags are the standalone profile's flags: they describe the engine
// only without --fleet (with it, the fleet's profile does).
var profileFlags = []string{"prefill-tokens-per-s", "overhead-ms", "decode-step-ms", "decode-step-per-seq-ms",
	"max-running", "max-batched-tokens", "kv-capacity-tokens", "block-size", "max-context-tokens"}

func newEngineSimCmd() *cobra.Command {
	var e engineSimFlags
	cmd := &cobra.Command{
		Use:   "engine-sim",
		Short: "Serve simulated vLLM-compatible inference engines",
		Long: `engine-sim serves simulated LLM inference engines that look like vLLM's
OpenAI-compatible server to a load balancer: /v1/chat/completions and
/v1/completions (streaming or not), /v1/models, /health, /metrics (vLLM's
metric names). Latency follows the GPU profile: continuous batching, chunked
prefill, a block prefix cache. Run-time faults (errors, slowdown, hang,
health failure, crash) are set on a separate admin listener (--admin-listen),
never on an engine's API port. See docs/engine-sim.md.

Fleet mode serves every engine of a fleet spec (or those named by --engines),
each on its own address. Standalone mode (--listen) serves one engine; its
profile comes from the fleet's (--gpu, --model) profile when --fleet is
given, else from the profile flags.

--server sglang mimics SGLang instead of vLLM: sglang: metric names (absent
until the first request, as SGLang's are), /health_generate besides /health.
In fleet mode each engine mimics its engines[].server unless --server is
given. --loading-for makes engines answer 503 (health and requests) for a
while after they start, as a server loading its model does.`,
		Example: `  inferlb-lab engine-sim --fleet examples/fleet-3region.yaml --time-scale 0.1
  inferlb-lab engine-sim --listen 127.0.0.1:18100 --gpu H100 --model llama-3.1-8b --fleet examples/fleet-3region.yaml
  inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --prefill-tokens-per-s 25000 --decode-step-ms 6.5 --max-running 128
  inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --server sglang --loading-for 2s`,
		Args: cobra.NoArgs,
		RunE: e.run,
	}
	f := cmd.Flags()
	f.StringVar(&e.fleetPath, "fleet", "", "fleet spec (YAML); alone, serves its engines at their addresses")
	f.StringVar(&e.engines, "engines", "", "fleet mode: comma-separated engine ids to serve (default all)")
	f.StringVar(&e.listen, "listen", "", "standalone mode: address of the one engine, e.g. 127.0.0.1:18100")
	f.StringVar(&e.gpu, "gpu", "", "standalone mode: GPU type (selects the fleet's profile with --fleet)")
	f.StringVar(&e.modelName, "model", "", "standalone mode: served model name")
	f.StringVar(&e.region, "region", "", "standalone mode: the engine's region (network delay with --fleet)")
	f.StringVar(&e.adminListen, "admin-listen", "", "address of the faults admin API (/admin/engines/{id}/faults); empty: none")
	f.Float64Var(&e.timeScale, "time-scale", 1, "real seconds per simulated second (0.1 runs 10x faster)")
	f.Uint64Var(&e.seed, "seed", 1, "seed of the error-rate fault's random choices")
	f.IntVar(&e.defaultMaxTokens, "default-max-tokens", 128, "output tokens when a request sets no max_tokens")
	f.Int64Var(&e.maxBody, "max-body-bytes", 4<<20, "largest request body; larger gets 413")
	f.StringVar(&e.server, "server", "", "server kind to mimic: vllm or sglang (default: vllm; in fleet mode each engine's engines[].server)")
	cli.SysmonFlag(f, &e.keepSysmonAwake)
	f.DurationVar(&e.loadingFor, "loading-for", 0, "answer 503 on health paths and requests for this long after start (a server loading its model)")
	d := enginesim.H100Llama8B
	f.Float64Var(&e.prof.PrefillTokensPerS, "prefill-tokens-per-s", d.PrefillTokensPerS, "standalone profile: prefill throughput (uncached tokens/s)")
	f.Float64Var(&e.prof.OverheadMs, "overhead-ms", d.OverheadMs, "standalone profile: fixed per-request overhead")
	f.Float64Var(&e.prof.DecodeStepMs, "decode-step-ms", d.DecodeStepMs, "standalone profile: step time intercept")
	f.Float64Var(&e.prof.DecodeStepPerSeqMs, "decode-step-per-seq-ms", d.DecodeStepPerSeqMs, "standalone profile: step time per running sequence")
	f.IntVar(&e.prof.MaxRunning, "max-running", d.MaxRunning, "standalone profile: running slots (vLLM max_num_seqs)")
	f.IntVar(&e.prof.MaxBatchedTokens, "max-batched-tokens", d.MaxBatchedTokens, "standalone profile: tokens per step (vLLM max_num_batched_tokens)")
	f.IntVar(&e.prof.KVCapacityTokens, "kv-capacity-tokens", d.KVCapacityTokens, "standalone profile: KV cache size in tokens")
	f.IntVar(&e.prof.BlockSize, "block-size", d.BlockSize, "standalone profile: KV block size in tokens")
	f.IntVar(&e.prof.MaxContextTokens, "max-context-tokens", d.MaxContextTokens, "standalone profile: context limit (vLLM max_model_len)")
	_ = cmd.MarkFlagFilename("fleet", "yaml", "yml")
	cliconfig.Add(cmd)
	return cmd
}

// engineSimFlags are inferlb-lab engine-sim's flags.
type engineSimFlags struct {
	fleetPath, engines, listen, gpu, modelName, region string
	adminListen                                        string
	timeScale                                          float64
	seed                                               uint64
	defaultMaxTokens                                   int
	keepSysmonAwake                                    bool
	maxBody                                            int64
	prof                                               fleet.Profile
	server                                             string
	loadingFor                                         time.Duration
}

// run carries out the command.
func (e *engineSimFlags) run(cmd *cobra.Command, args []string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The library reads 0 as "use the default"; on the command line
	// a 0 is a value the user typed, not an omission.
	if !(e.timeScale > 0) {
		return fmt.Errorf("--time-scale: must be > 0, got %v", e.timeScale)
	}
	if e.defaultMaxTokens < 1 {
		return fmt.Errorf("--default-max-tokens: must be at least 1, got %d", e.defaultMaxTokens)
	}
	if e.maxBody < 1 {
		return fmt.Errorf("--max-body-bytes: must be at least 1, got %d", e.maxBody)
	}
	if e.server != "" && e.server != enginesim.ServerVLLM && e.server != enginesim.ServerSGLang {
		return fmt.Errorf("--server: %q is not vllm or sglang", e.server)
	}
	if e.loadingFor < 0 {
		return fmt.Errorf("--loading-for: must not be negative, got %v", e.loadingFor)
	}
	for _, name := range profileFlags {
		if cmd.Flags().Changed(name) && (e.fleetPath != "" || e.listen == "") {
			return fmt.Errorf("%s is a standalone profile flag (--listen without --fleet); with --fleet the fleet's profile applies", cliconfig.Name(cmd.Flags(), name))
		}
	}
	for _, name := range []string{"max-running", "max-batched-tokens", "block-size", "max-context-tokens"} {
		if v, _ := cmd.Flags().GetInt(name); cmd.Flags().Changed(name) && v < 1 {
			return fmt.Errorf("%s: must be at least 1, got %d", cliconfig.Name(cmd.Flags(), name), v)
		}
	}
	var spec *fleet.Spec
	if e.fleetPath != "" {
		var err error
		if spec, err = fleet.Load(e.fleetPath); err != nil {
			return err
		}
	}
	cli.KeepSysmonAwake(e.keepSysmonAwake, log)
	return e.serve(cmd, spec, log)
}

// serve runs the fleet's engines (fleet mode) or the one engine (standalone mode) until the command's context ends.
func (e *engineSimFlags) serve(cmd *cobra.Command, spec *fleet.Spec, log *slog.Logger) error {
	ctx := cmd.Context()
	if e.listen == "" {
		if spec == nil {
			return fmt.Errorf("either --fleet (fleet mode) or --listen (standalone mode) is required")
		}
		if e.gpu != "" || e.modelName != "" || e.region != "" {
			return fmt.Errorf("--gpu, --model and --region apply to standalone mode (--listen)")
		}
		var ids []string
		if e.engines != "" {
			for _, id := range strings.Split(e.engines, ",") {
				if id = strings.TrimSpace(id); id == "" {
					return fmt.Errorf("--engines: empty engine id in %q", e.engines)
				}
				ids = append(ids, id)
			}
		}
		fl, err := enginesim.StartFleet(ctx, spec, enginesim.FleetOptions{
			Engines: ids, TimeScale: e.timeScale, Seed: e.seed, DefaultMaxTokens: e.defaultMaxTokens,
			MaxBodyBytes: e.maxBody, Logger: log, Server: e.server, LoadingFor: e.loadingFor,
		})
		if err != nil {
			return err
		}
		for _, s := range fl.Servers() {
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID(), s.URL())
		}
		if err := serveAdmin(cmd, e.adminListen, fl.Servers()); err != nil {
			fl.Close()
			return err
		}
		<-ctx.Done()
		fl.Close()
		return nil
	}
	if e.engines != "" {
		return fmt.Errorf("--engines applies to fleet mode (without --listen)")
	}
	if e.modelName == "" {
		return fmt.Errorf("--model is required in standalone mode")
	}
	o := enginesim.Options{Listen: e.listen, Model: e.modelName, Region: e.region}
	if spec != nil {
		if e.gpu == "" {
			return fmt.Errorf("--gpu is required with --fleet in standalone mode")
		}
		p, ok := spec.Profile(e.gpu, e.modelName)
		if !ok {
			return fmt.Errorf("--gpu %q --model %q: the fleet has no such profile", e.gpu, e.modelName)
		}
		o.Profile, o.Fleet = p, spec
		if m, ok := spec.ModelByName(e.modelName); ok && p.MaxContextTokens == 0 {
			o.MaxContextTokens = m.MaxContextTokens
		}
	} else {
		e.prof.GPU, e.prof.Model = e.gpu, e.modelName
		if e.prof.GPU == "" {
			e.prof.GPU = "flags"
		}
		o.Profile = e.prof
	}
	o.TimeScale, o.Seed, o.DefaultMaxTokens, o.MaxBodyBytes, o.Logger = e.timeScale, e.seed, e.defaultMaxTokens, e.maxBody, log
	o.Server, o.LoadingFor = e.server, e.loadingFor
	s, err := enginesim.Start(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID(), s.URL())
	if err := serveAdmin(cmd, e.adminListen, []*enginesim.Server{s}); err != nil {
		s.Close()
		return err
	}
	<-ctx.Done()
	return s.Close()
}

// serveAdmin starts the faults admin listener until the command's context
// ends ("" = none) and prints its address.
func serveAdmin(cmd *cobra.Command, addr string, engines []*enginesim.Server) error {
	if addr == "" {
		return nil
	}
	bound, _, err := enginesim.ServeAdmin(cmd.Context(), addr, engines)
	if err != nil {
		return fmt.Errorf("--admin-listen: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "admin http://%s/admin/engines\n", bound)
	return nil
}
