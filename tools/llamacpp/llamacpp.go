// Package llamacpp runs llama.cpp's llama-server, a real inference engine
// written by others, on the tiny model scripts/setup.sh --engines writes:
// the tests that put a real engine behind Envoy, the control plane and
// ext_proc (test/drills) and `inferlb-lab demo --engines llamacpp` start their
// servers here. Each server is one child process on loopback, one compute
// thread, a small context, Prometheus metrics on (--metrics), and can be
// killed, stalled (SIGSTOP) and resumed like a real engine.
package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/internal/envoybin"
	"github.com/inferlb/inferlb/internal/envoyrun"
)

// ErrNotBuilt is returned by Binary and Model when setup has not built the
// server or written the model.
var ErrNotBuilt = errors.New("llama-server or its model is not there: run scripts/setup.sh --engines (make test does), or set INFERLB_LLAMA_SERVER and INFERLB_LLAMA_MODEL")

// Binary returns the llama-server to run: $INFERLB_LLAMA_SERVER, else the
// one scripts/setup.sh --engines built under the virtual environment
// ($VENV/llama.cpp/VERSION/bin/llama-server; the highest version if there
// are several).
func Binary() (string, error) {
	if p := os.Getenv("INFERLB_LLAMA_SERVER"); p != "" {
		return p, nil
	}
	found, _ := filepath.Glob(filepath.Join(envoybin.Venv(), "llama.cpp", "*", "bin", "llama-server"))
	sort.Strings(found)
	for i := len(found) - 1; i >= 0; i-- {
		if st, err := os.Stat(found[i]); err == nil && st.Mode()&0o111 != 0 {
			return found[i], nil
		}
	}
	return "", ErrNotBuilt
}

// Model returns the GGUF model to serve: $INFERLB_LLAMA_MODEL, else the
// tiny model scripts/setup.sh --engines wrote ($VENV/llama.cpp/tiny-llama.gguf:
// 4 layers of width 256, random weights, GPT-2's tokenizer).
func Model() (string, error) {
	if p := os.Getenv("INFERLB_LLAMA_MODEL"); p != "" {
		return p, nil
	}
	p := filepath.Join(envoybin.Venv(), "llama.cpp", "tiny-llama.gguf")
	if _, err := os.Stat(p); err != nil {
		return "", ErrNotBuilt
	}
	return p, nil
}

// Available reports whether both the server and the model are there.
func Available() error {
	if _, err := Binary(); err != nil {
		return err
	}
	_, err := Model()
	return err
}

// Options configure a server.
type Options struct {
	// Listen is host:port; "" picks a free port on 127.0.0.1.
	Listen string
	// Model is the GGUF file; "" is Model().
	Model string
	// Alias is the model name the server reports (--alias); "" leaves it
	// to the server.
	Alias string
	// Slots is the number of requests decoded together (--parallel);
	// default 2. Requests beyond it wait (llamacpp:requests_deferred).
	Slots int
	// SlotContext is each slot's context in tokens, prompt plus output
	// (the server's --ctx-size is Slots × SlotContext); default 4096.
	SlotContext int
	// Threads for generation and batch processing; default 1 (the test
	// machines have 2 cores for everything).
	Threads int
	// LogPath receives the server's output (a restart appends to it); ""
	// discards it.
	LogPath string
	// Args are extra llama-server arguments.
	Args []string
	// StartTimeout bounds the wait for /health to answer 200 (the model
	// loaded); default 60 s.
	StartTimeout time.Duration
}

// Server is a running llama-server.
type Server struct {
	opt   Options
	procs *childproc.Group
	proc  *childproc.Proc
}

// CommandLine returns the llama-server binary and its arguments for o, and
// o with its defaults filled in (a free port if Listen is empty). The demo
// runs it under its own supervisor; Start runs it for tests.
func CommandLine(o Options) (bin string, args []string, _ Options, err error) {
	if bin, err = Binary(); err != nil {
		return "", nil, o, err
	}
	if o.Model == "" {
		if o.Model, err = Model(); err != nil {
			return "", nil, o, err
		}
	}
	if o.Slots == 0 {
		o.Slots = 2
	}
	if o.SlotContext == 0 {
		o.SlotContext = 4096
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.Slots < 1 || o.SlotContext < 64 || o.Threads < 1 {
		return "", nil, o, fmt.Errorf("llamacpp: slots %d, slot context %d, threads %d: want ≥ 1, ≥ 64, ≥ 1", o.Slots, o.SlotContext, o.Threads)
	}
	if o.Listen == "" {
		p, err := envoyrun.FreePort()
		if err != nil {
			return "", nil, o, err
		}
		o.Listen = fmt.Sprintf("127.0.0.1:%d", p)
	}
	host, port, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return "", nil, o, fmt.Errorf("llamacpp: listen %q: %w", o.Listen, err)
	}
	args = []string{"--model", o.Model, "--host", host, "--port", port,
		"--threads", strconv.Itoa(o.Threads), "--threads-batch", strconv.Itoa(o.Threads),
		"--parallel", strconv.Itoa(o.Slots), "--ctx-size", strconv.Itoa(o.Slots * o.SlotContext),
		// Metrics for the control plane; /slots for a view of the slots'
		// caches. The host-memory prompt cache is kept small: the slots'
		// own KV caches are the prefix cache that matters here.
		"--metrics", "--slots", "--cache-ram", "64", "--no-webui"}
	if o.Alias != "" {
		args = append(args, "--alias", o.Alias)
	}
	return bin, append(args, o.Args...), o, nil
}

// Start runs llama-server and waits until its /health answers 200. The
// server is a child process of internal/childproc: it dies with the caller.
func Start(ctx context.Context, o Options) (*Server, error) {
	bin, args, o, err := CommandLine(o)
	if err != nil {
		return nil, err
	}
	logPath := o.LogPath
	if logPath == "" {
		logPath = os.DevNull
	}
	s := &Server{opt: o, procs: &childproc.Group{}}
	if s.proc, err = s.procs.StartLog("llama-server", logPath, exec.Command(bin, args...)); err != nil {
		return nil, fmt.Errorf("llamacpp: %w", err)
	}
	if err := s.waitReady(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Addr is host:port.
func (s *Server) Addr() string { return s.opt.Listen }

// URL is http://host:port.
func (s *Server) URL() string { return "http://" + s.opt.Listen }

// Options returns the server's options (defaults filled in).
func (s *Server) Options() Options { return s.opt }

// waitReady waits until the server's /health answers 200 (the model is
// loaded); it kills the server when it is not ready in time.
func (s *Server) waitReady(ctx context.Context) error {
	c := &http.Client{Timeout: 2 * time.Second}
	err := envoyrun.Poll(ctx, s.opt.StartTimeout, 50*time.Millisecond, func() error {
		if !s.proc.Running() {
			return errors.New("exited")
		}
		return s.health(c)
	})
	if err != nil {
		s.Kill()
		tail := s.proc.Tail(15)
		if tail != "" {
			tail = "\n" + tail
		}
		return fmt.Errorf("llamacpp: llama-server on %s not ready: %w%s", s.opt.Listen, err, tail)
	}
	return nil
}

// health asks the server's /health with c: nil when it answers 200.
func (s *Server) health(c *http.Client) error {
	resp, err := c.Get(s.URL() + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/health: %s", resp.Status)
	}
	return nil
}

// Restart starts the server again with the same arguments (same port)
// after Kill or Stop, and waits until it is ready.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.procs.Restart(s.proc); err != nil {
		return fmt.Errorf("llamacpp: %w", err)
	}
	return s.waitReady(ctx)
}

// Kill sends SIGKILL and waits until the process is gone: no graceful
// stop, the kernel closes its sockets.
func (s *Server) Kill() { s.procs.Kill(s.proc) }

// Stop sends SIGTERM (resuming a paused server first) and waits, killing
// after 10 s.
func (s *Server) Stop() { s.procs.Stop(s.proc) }

// Pause stalls the server (SIGSTOP): its sockets stay open and accept
// connections, nothing answers. Resume undoes it.
func (s *Server) Pause() error { return s.proc.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.proc.Signal(syscall.SIGCONT) }

// Running reports whether the process is up.
func (s *Server) Running() bool { return s.proc.Running() }
