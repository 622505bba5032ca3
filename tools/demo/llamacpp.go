package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
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

// llamaEngines are the demo's llama-servers, one per fleet engine, run by
// the supervisor (so they die with the demo).
type llamaEngines struct {
	sup *supervisor
	log *slog.Logger

	mu    sync.Mutex
	cmds  map[string][]string // engine id → binary and arguments
	procs map[string]*proc
}

// startLlamaEngines starts a llama-server for every engine of the fleet, on
// the engine's address: its profile's max_running slots (at most 4) of its
// max_context_tokens each, one thread, the model named as the fleet names
// it.
func startLlamaEngines(sup *supervisor, log *slog.Logger, spec *fleet.Spec) (*llamaEngines, error) {
	l := &llamaEngines{sup: sup, log: log, cmds: map[string][]string{}, procs: map[string]*proc{}}
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
		l.cmds[e.ID] = append([]string{bin}, args...)
		if err := l.start(e.ID); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (l *llamaEngines) start(id string) error {
	c := l.cmds[id]
	p, err := l.sup.startProc("engine-"+id, c[0], c[1:]...)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.procs[id] = p
	l.mu.Unlock()
	return nil
}

// crash kills the engine's server (SIGKILL, as a crash) at the demo's
// failure time and starts it again on its port downFor later.
func (l *llamaEngines) crash(ctx context.Context, id string, at time.Time, downFor time.Duration) {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	l.mu.Lock()
	p := l.procs[id]
	l.mu.Unlock()
	l.sup.kill(p)
	l.log.Info("demo: llama-server killed on purpose", "engine", id, "back_after", downFor)
	t.Reset(downFor)
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if err := l.start(id); err != nil {
		l.log.Error("demo: restart llama-server", "engine", id, "err", err)
	}
}

// kill ends a child with SIGKILL (a crash, no cleanup) and waits for it;
// the supervisor does not count it as a failure.
func (s *supervisor) kill(p *proc) {
	s.mu.Lock()
	p.stopping = true
	s.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}
