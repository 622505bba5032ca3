package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
)

// RTT is the fleet's round trip from a caller's region to an engine's
// region (api/fleet's lookup, with an error naming an unknown region).
func RTT(spec *fleet.Spec, from, to string) (time.Duration, error) {
	d, ok := spec.RTT(from, to)
	if !ok {
		if _, known := spec.RegionByName(from); !known {
			return 0, fmt.Errorf("unknown region %q", from)
		}
		return 0, fmt.Errorf("no network link between %q and %q", from, to)
	}
	return d, nil
}

// FleetOptions configure StartFleet.
type FleetOptions struct {
	// Engines selects engines by id; empty means every engine of the spec.
	Engines []string
	// AnyPort listens on 127.0.0.1:0 instead of each engine's address (for
	// tests); read the addresses from the servers.
	AnyPort bool
	// TimeScale, Seed, DefaultMaxTokens, MaxBodyBytes and Logger are as in
	// Options and apply to every engine (each engine's seed is Seed plus
	// its index in the spec).
	TimeScale        float64
	Seed             uint64
	DefaultMaxTokens int
	MaxBodyBytes     int64
	Logger           *slog.Logger
	// Server, if set, overrides every engine's server kind (the fleet's
	// engines[].server otherwise); LoadingFor is as in Options.
	Server     string
	LoadingFor time.Duration
}

// Fleet is a set of simulated engines served by one process.
type Fleet struct {
	servers []*Server
	byID    map[string]*Server
}

// EngineOptions returns the Options for the engine with the given id, from
// the spec: its address, region, model, profile (ProfileOf) and context
// limit (the profile's, else the model's).
func EngineOptions(spec *fleet.Spec, id string) (Options, error) {
	e, ok := spec.EngineByID(id)
	if !ok {
		return Options{}, fmt.Errorf("enginesim: engine %q is not in the fleet", id)
	}
	p, ok := spec.ProfileOf(e)
	if !ok {
		return Options{}, fmt.Errorf("enginesim: engine %q: no profile for gpu %q and model %q", id, e.GPU, e.Model)
	}
	maxCtx := p.MaxContextTokens
	if maxCtx == 0 {
		if m, ok := spec.ModelByName(e.Model); ok {
			maxCtx = m.MaxContextTokens
		}
	}
	return Options{
		Listen: e.Address, ID: e.ID, Model: e.Model, Region: e.Region, Profile: p,
		MaxContextTokens: maxCtx, Fleet: spec, Replicas: e.Replicas, Server: e.Server,
	}, nil
}

// StartFleet starts the selected engines of spec (built by fleet.Load,
// Parse or New), each on its own port. On error, the engines already
// started are closed.
func StartFleet(ctx context.Context, spec *fleet.Spec, fo FleetOptions) (*Fleet, error) {
	ids := fo.Engines
	if len(ids) == 0 {
		for _, e := range spec.Engines {
			ids = append(ids, e.ID)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("enginesim: the fleet has no engines")
	}
	f := &Fleet{byID: make(map[string]*Server)}
	for _, id := range ids {
		if _, dup := f.byID[id]; dup {
			f.Close()
			return nil, fmt.Errorf("enginesim: engine %q selected twice", id)
		}
		o, err := EngineOptions(spec, id)
		if err != nil {
			f.Close()
			return nil, err
		}
		if fo.AnyPort {
			o.Listen = "127.0.0.1:0"
		}
		o.TimeScale = fo.TimeScale
		o.Seed = fo.Seed + uint64(len(f.servers))
		o.DefaultMaxTokens = fo.DefaultMaxTokens
		o.MaxBodyBytes = fo.MaxBodyBytes
		o.Logger = fo.Logger
		o.LoadingFor = fo.LoadingFor
		if fo.Server != "" {
			o.Server = fo.Server
		}
		s, err := Start(ctx, o)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("enginesim: engine %q: %w", id, err)
		}
		f.servers = append(f.servers, s)
		f.byID[id] = s
	}
	return f, nil
}

// Servers returns the engines in selection order.
func (f *Fleet) Servers() []*Server { return f.servers }

// Server returns the engine with the given id, or nil.
func (f *Fleet) Server(id string) *Server { return f.byID[id] }

// Close stops every engine and waits for them.
func (f *Fleet) Close() {
	for _, s := range f.servers {
		s.cancel()
	}
	for _, s := range f.servers {
		s.Close()
	}
}
