// Package llamacpp runs llama.cpp's llama-server, a real inference engine
// written by others, on the tiny model scripts/setup.sh --engines writes:
// the tests that put a real engine behind Envoy, the control plane and
// ext_proc (test/drills) and `inferlb demo --engines llamacpp` start their
// servers here. Each server is one child process on loopback, one compute
// thread, a small context, Prometheus metrics on (--metrics), and can be
// killed, stalled (SIGSTOP) and resumed like a real engine.
package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
	// LogPath receives the server's output; "" discards it.
	LogPath string
	// Args are extra llama-server arguments.
	Args []string
	// StartTimeout bounds the wait for /health to answer 200 (the model
	// loaded); default 60 s.
	StartTimeout time.Duration
}

// Server is a running llama-server.
type Server struct {
	opt  Options
	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
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

// Start runs llama-server and waits until its /health answers 200.
func Start(ctx context.Context, o Options) (*Server, error) {
	bin, args, o, err := CommandLine(o)
	if err != nil {
		return nil, err
	}
	s := &Server{opt: o, bin: bin, args: args}
	if err := s.start(ctx); err != nil {
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

func (s *Server) start(ctx context.Context) error {
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return errors.New("llamacpp: server is running")
	}
	out := io.Discard
	var logf *os.File
	if s.opt.LogPath != "" {
		f, err := os.OpenFile(s.opt.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		logf, out = f, f
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		if logf != nil {
			logf.Close()
		}
		return fmt.Errorf("llamacpp: start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if logf != nil {
			logf.Close()
		}
		close(done)
	}()
	s.cmd, s.done, s.log = cmd, done, logf
	s.mu.Unlock()

	c := &http.Client{Timeout: 2 * time.Second}
	err := envoyrun.Poll(ctx, s.opt.StartTimeout, 50*time.Millisecond, func() error {
		select {
		case <-done:
			return errors.New("exited")
		default:
		}
		resp, err := c.Get(s.URL() + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/health: %s", resp.Status)
		}
		return nil
	})
	if err != nil {
		s.Kill()
		return fmt.Errorf("llamacpp: %s on %s not ready: %w%s", s.bin, s.opt.Listen, err, s.logTail())
	}
	return nil
}

func (s *Server) logTail() string {
	if s.opt.LogPath == "" {
		return ""
	}
	b, _ := os.ReadFile(s.opt.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return "\n" + strings.Join(lines, "\n")
}

// Restart starts the server again with the same arguments (same port)
// after Kill or Stop, and waits until it is ready.
func (s *Server) Restart(ctx context.Context) error { return s.start(ctx) }

// Kill sends SIGKILL and waits until the process is gone: no graceful
// stop, the kernel closes its sockets.
func (s *Server) Kill() { s.end(syscall.SIGKILL) }

// Stop sends SIGTERM and waits, killing after 10 s.
func (s *Server) Stop() { s.end(syscall.SIGTERM) }

func (s *Server) end(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	// A stalled process takes no signal but SIGKILL: resume it first.
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Pause stalls the server (SIGSTOP): its sockets stay open and accept
// connections, nothing answers. Resume undoes it.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("llamacpp: server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Running reports whether the process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}
