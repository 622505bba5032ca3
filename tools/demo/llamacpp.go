package demo

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/tools/llamacpp"
)

// Engine kinds the demo runs (Options.Engines).
const (
	// EnginesSim: the engine simulator serves every engine of the fleet.
	EnginesSim = "sim"
	// EnginesLlamaCpp: one llama.cpp llama-server per engine of the fleet,
	// on the tiny model scripts/setup.sh --engines builds.
	EnginesLlamaCpp = "llamacpp"
)

// llamaEngines are the demo's llama-servers, one per fleet engine, run in
// the demo's process group (so they die with the demo).
type llamaEngines struct {
	procs *childproc.Group
	log   *slog.Logger
	// procs by engine id; complete before the demo's goroutines start.
	byID map[string]*childproc.Proc
}

// startLlamaEngines starts a llama-server for every engine of the fleet, on
// the engine's address: its profile's max_running slots (at most 4) of its
// max_context_tokens each, one thread, the model named as the fleet names
// it.
func startLlamaEngines(procs *childproc.Group, log *slog.Logger, spec *fleet.Spec) (*llamaEngines, error) {
	l := &llamaEngines{procs: procs, log: log, byID: map[string]*childproc.Proc{}}
	for _, e := range spec.Engines {
		if e.Server != fleet.ServerLlamaCpp {
			return nil, fmt.Errorf("demo: --engines llamacpp runs llama-server for every engine, but engine %s is server %q (set server: llamacpp)", e.ID, e.Server)
		}
		prof, ok := spec.ProfileOf(e)
		if !ok {
			return nil, fmt.Errorf("demo: engine %s has no profile", e.ID)
		}
		bin, args, _, err := llamacpp.CommandLine(llamacpp.Options{Listen: e.Address, Alias: e.Model,
			Slots: min(max(prof.MaxRunning, 1), 4), SlotContext: prof.MaxContextTokens})
		if err != nil {
			return nil, fmt.Errorf("demo: engine %s: %w", e.ID, err)
		}
		p, err := procs.Start("engine-"+e.ID, bin, args...)
		if err != nil {
			return nil, err
		}
		l.byID[e.ID] = p
	}
	return l, nil
}

// crash kills the engine's server (SIGKILL, as a crash; not counted as a
// failure) at the demo's failure time and starts it again on its port
// downFor later, its log continued.
func (l *llamaEngines) crash(ctx context.Context, id string, at time.Time, downFor time.Duration) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	p := l.byID[id]
	l.procs.Kill(p)
	l.log.Info("demo: llama-server killed on purpose", "engine", id, "back_after", downFor)
	t.Reset(downFor)
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if err := l.procs.Restart(p); err != nil {
		l.log.Error("demo: restart llama-server", "engine", id, "err", err)
	}
}
