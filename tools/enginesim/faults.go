package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/inferlb/inferlb/tools/enginesim/model"
)

// Faults are the run-time faults of one engine.
type Faults struct {
	// ErrorRate is the fraction of completion requests answered with a 500
	// (drawn from the engine's seeded generator), in [0, 1].
	ErrorRate float64 `json:"error_rate"`
	// Slowdown multiplies the duration of every scheduler step; 1 is
	// normal, 0 in SetFaults means 1.
	Slowdown float64 `json:"slowdown"`
	// Hang stops the scheduler: requests make no progress until cleared
	// or until their clients give up.
	Hang bool `json:"hang"`
	// HealthFail makes /health answer 503.
	HealthFail bool `json:"health_fail"`
	// Crash closes the listener and drops every connection.
	Crash bool `json:"crash"`
	// RestartAfterS, with Crash, brings the engine back after this many
	// simulated seconds (scaled by the time scale); 0 stays down until
	// Restart or SetFaults without Crash.
	RestartAfterS float64 `json:"restart_after_s,omitempty"`
}

func (f Faults) validate() error {
	var errs []error
	if !(f.ErrorRate >= 0 && f.ErrorRate <= 1) {
		errs = append(errs, fmt.Errorf("error_rate: must be in [0, 1], got %v", f.ErrorRate))
	}
	if !(f.Slowdown > 0) || math.IsInf(f.Slowdown, 0) {
		errs = append(errs, fmt.Errorf("slowdown: must be a positive number, got %v", f.Slowdown))
	}
	if !(f.RestartAfterS >= 0) || math.IsInf(f.RestartAfterS, 0) {
		errs = append(errs, fmt.Errorf("restart_after_s: must be a non-negative number, got %v", f.RestartAfterS))
	}
	if f.RestartAfterS > 0 && !f.Crash {
		errs = append(errs, errors.New("restart_after_s: only meaningful with crash"))
	}
	return errors.Join(errs...)
}

// Faults returns the engine's current faults.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// SetFaults replaces the engine's faults. Setting Crash crashes a running
// engine; clearing it restarts a crashed one.
func (s *Server) SetFaults(f Faults) error {
	if f.Slowdown == 0 {
		f.Slowdown = 1
	}
	if err := f.validate(); err != nil {
		return fmt.Errorf("enginesim: faults: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("enginesim: engine closed")
	}
	now := s.vnow()
	s.eng.SetFaults(f.Slowdown, f.Hang, now)
	wasCrashed := s.crashed
	s.faults = f
	s.mu.Unlock()
	s.wake()
	s.log.Info("faults set", "error_rate", f.ErrorRate, "slowdown", f.Slowdown, "hang", f.Hang,
		"health_fail", f.HealthFail, "crash", f.Crash)
	switch {
	case f.Crash && !wasCrashed:
		s.crash(f.RestartAfterS)
	case !f.Crash && wasCrashed:
		return s.Restart()
	}
	return nil
}

// crash closes the listener and every connection.
func (s *Server) crash(restartAfterS float64) {
	s.mu.Lock()
	if s.crashed || s.closed {
		s.mu.Unlock()
		return
	}
	s.crashed = true
	s.cutAtCrash = s.completing
	srv, ch := s.httpSrv, s.crashCh
	if restartAfterS > 0 {
		s.wg.Add(1)
		d := s.real(time.Duration(restartAfterS * float64(time.Second)))
		go func() {
			defer s.wg.Done()
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-s.ctx.Done():
			case <-t.C:
				if err := s.Restart(); err != nil {
					s.log.Error("restart after crash", "err", err)
				}
			}
		}()
	}
	s.mu.Unlock()
	close(ch)
	_ = srv.Close()
	s.log.Warn("engine crashed (fault)")
}

// Restart brings a crashed engine back on the same address, with an empty
// KV cache and fresh counters; it does nothing if the engine is up.
func (s *Server) Restart() error {
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("enginesim: engine closed")
	}
	if !s.crashed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.active.Wait() // every handler of the crashed incarnation has left
	var ln net.Listener
	var err error
	for range 50 { // the old socket may linger for a moment
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		select {
		case <-s.ctx.Done():
			return s.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("enginesim: restart: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return errors.New("enginesim: engine closed")
	}
	eng, err := model.NewReplicas(s.opts.Replicas, s.cfg, (*listener)(s))
	if err != nil { // the options were valid at Start; never expected
		s.mu.Unlock()
		ln.Close()
		return fmt.Errorf("enginesim: restart: %w", err)
	}
	s.eng = eng
	s.eng.SetFaults(s.faults.Slowdown, s.faults.Hang, s.vnow())
	s.faults.Crash = false
	s.faults.RestartAfterS = 0
	s.mu.Unlock()
	s.serve(ln)
	s.wake()
	s.log.Info("engine restarted")
	return nil
}

// faultsJSON is the admin endpoint's body: absent fields are cleared, except
// slowdown, which is 1 when absent.
type faultsJSON struct {
	ErrorRate     float64  `json:"error_rate"`
	Slowdown      *float64 `json:"slowdown"`
	Hang          bool     `json:"hang"`
	HealthFail    bool     `json:"health_fail"`
	Crash         bool     `json:"crash"`
	RestartAfterS float64  `json:"restart_after_s"`
}

// parseFaults decodes and validates an admin faults body.
func parseFaults(body []byte) (Faults, error) {
	var fj faultsJSON
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fj); err != nil {
		return Faults{}, fmt.Errorf("invalid faults JSON: %w", err)
	}
	if dec.More() {
		return Faults{}, errors.New("invalid faults JSON: data after the top-level value")
	}
	f := Faults{ErrorRate: fj.ErrorRate, Slowdown: 1, Hang: fj.Hang, HealthFail: fj.HealthFail,
		Crash: fj.Crash, RestartAfterS: fj.RestartAfterS}
	if fj.Slowdown != nil {
		f.Slowdown = *fj.Slowdown
	}
	if err := f.validate(); err != nil {
		return Faults{}, err
	}
	return f, nil
}

func (s *Server) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, s.Faults())
}

func (s *Server) deleteFaults(w http.ResponseWriter, _ *http.Request) {
	if err := s.SetFaults(Faults{}); err != nil {
		writeError(w, &apiError{status: 500, typ: "InternalServerError", message: err.Error()})
		return
	}
	writeJSON(w, 200, s.Faults())
}

func (s *Server) postFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeError(w, &apiError{status: 413, typ: "RequestEntityTooLarge", message: err.Error()})
		return
	}
	f, err := parseFaults(body)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeError(w, &apiError{status: 500, typ: "InternalServerError", message: err.Error()})
		return
	}
	writeJSON(w, 200, s.Faults())
}

// AdminHandler serves the engines' faults on an admin listener of its own,
// apart from the OpenAI API: a client of the API (or anyone who can reach
// an engine's port) must not be able to crash or slow it.
//
//	GET                  /admin/engines               the engines, by id, with their URLs
//	GET | POST | DELETE  /admin/engines/{id}/faults   one engine's faults (body: Faults JSON)
//	GET | POST | DELETE  /admin/faults                the same, when there is one engine
func AdminHandler(engines []*Server) http.Handler {
	byID := map[string]*Server{}
	for _, e := range engines {
		byID[e.ID()] = e
	}
	mux := http.NewServeMux()
	one := func(h func(*Server, http.ResponseWriter, *http.Request)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.PathValue("id")
			e, ok := byID[id]
			if id == "" && len(engines) == 1 {
				e, ok = engines[0], true
			}
			if !ok {
				writeError(w, &apiError{status: 404, typ: "NotFoundError", message: fmt.Sprintf("no engine %q here", id)})
				return
			}
			h(e, w, r)
		}
	}
	for _, p := range []string{"/admin/engines/{id}/faults", "/admin/faults"} {
		if p == "/admin/faults" && len(engines) != 1 {
			continue
		}
		mux.Handle("GET "+p, one((*Server).getFaults))
		mux.Handle("POST "+p, one((*Server).postFaults))
		mux.Handle("DELETE "+p, one((*Server).deleteFaults))
	}
	mux.HandleFunc("GET /admin/engines", func(w http.ResponseWriter, _ *http.Request) {
		type eng struct {
			ID  string `json:"id"`
			URL string `json:"url"`
		}
		out := []eng{}
		for _, e := range engines {
			out = append(out, eng{e.ID(), e.URL()})
		}
		writeJSON(w, 200, out)
	})
	return mux
}

// ServeAdmin serves AdminHandler on addr until ctx ends; it returns the
// bound address and a function that waits for the server to stop.
func ServeAdmin(ctx context.Context, addr string, engines []*Server) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("enginesim: admin listener: %w", err)
	}
	srv := &http.Server{Handler: AdminHandler(engines), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	return ln.Addr().String(), func() { stop(); _ = srv.Close(); <-done }, nil
}
