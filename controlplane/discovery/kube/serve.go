package kube

import (
	"context"
	"fmt"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
)

// ServeOptions configure ServeControlPlane.
type ServeOptions struct {
	// FirstFleet bounds the wait for the first fleet (the pool, a ready
	// pod and the ConfigMap); 0: two minutes.
	FirstFleet time.Duration
	// Adjust, if set, turns each discovered spec into the one planned for
	// (e.g. fleet.Spec.InRealTime for simulated engines).
	Adjust func(*fleet.Spec) (*fleet.Spec, error)
	// Started, if set, is called with the runner once it was built, before
	// it runs (tests read its addresses).
	Started func(*controlplane.Runner)
}

// ServeControlPlane runs the control plane on the fleet d discovers: it
// waits for the first fleet, starts a Runner with it (cfg.Fleet is
// replaced), and hands it every later fleet (Runner.UpdateFleet) until ctx
// ends or the runner fails; then discovery stops too.
func ServeControlPlane(ctx context.Context, d *Discovery, cfg controlplane.RunConfig, o ServeOptions) error {
	if o.FirstFleet <= 0 {
		o.FirstFleet = 2 * time.Minute
	}
	adjust := o.Adjust
	if adjust == nil {
		adjust = func(s *fleet.Spec) (*fleet.Spec, error) { return s, nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first, later, discErr, err := d.WaitFirst(ctx, o.FirstFleet)
	if err != nil {
		cancel()
		_ = discErr()
		return err
	}
	if cfg.Fleet, err = adjust(first); err != nil {
		cancel()
		_ = discErr()
		return fmt.Errorf("kubernetes discovery: %w", err)
	}
	r, err := controlplane.NewRunner(cfg)
	if err != nil {
		cancel()
		_ = discErr()
		return err
	}
	if o.Started != nil {
		o.Started(r)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	log := d.log
	for {
		select {
		case err := <-runDone:
			cancel()
			if derr := discErr(); err == nil {
				err = derr
			}
			return err
		case spec, ok := <-later:
			if !ok {
				// Discovery ended: by ctx (the runner ends too), or failing.
				derr := discErr()
				cancel()
				rerr := <-runDone
				if derr != nil {
					return derr
				}
				return rerr
			}
			if spec, err = adjust(spec); err == nil {
				err = r.UpdateFleet(spec)
			}
			if err != nil {
				log.Error("kubernetes discovery: fleet not applied", "err", err)
			}
		}
	}
}
