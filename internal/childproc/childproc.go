// Package childproc starts and stops the child processes of the project's
// commands and tests (engines, Envoys, control planes, rival routers): each
// with its output in a log file of its own, in its own process group, ended
// by the kernel if the parent dies, stopped gracefully (SIGTERM, then
// SIGKILL to its whole group after a grace period), newest first.
package childproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultGrace is how long Stop waits after SIGTERM before SIGKILL.
const DefaultGrace = 10 * time.Second

// Group is a set of child processes whose logs go to one directory.
type Group struct {
	// Dir holds one log file per process, NAME.log.
	Dir string
	// Log, if set, receives a line per start and stop.
	Log *slog.Logger
	// Grace is how long Stop waits after SIGTERM (0: DefaultGrace).
	Grace time.Duration

	mu    sync.Mutex
	procs []*Proc // guarded by mu
}

// Proc is one child process of a Group.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // set before done is closed

	mu       sync.Mutex
	stopping bool // guarded by mu: stopped on purpose
	// Ends, when set, marks a process expected to end by itself (a load
	// generator): Exited does not report it.
	ends bool
}

// Start runs bin with args, its output in Dir/name.log.
func (g *Group) Start(name, bin string, args ...string) (*Proc, error) {
	return g.StartCmd(name, exec.Command(bin, args...))
}

// StartCmd runs a prepared command (its environment or working directory
// set by the caller); its output goes to Dir/name.log.
func (g *Group) StartCmd(name string, cmd *exec.Cmd) (*Proc, error) {
	if g.Dir == "" {
		return nil, errors.New("childproc: the group has no log directory")
	}
	logPath := filepath.Join(g.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	if g.Log != nil {
		g.Log.Info("started", "process", name, "pid", cmd.Process.Pid, "log", logPath)
	}
	return p, nil
}

// EndsByItself marks p as a process that ends when its work is done, so
// Exited does not report its exit.
func (p *Proc) EndsByItself() *Proc {
	p.mu.Lock()
	p.ends = true
	p.mu.Unlock()
	return p
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; valid after Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Exited returns an error naming the first process that exited without
// being stopped (and not marked EndsByItself), with the end of its log.
func (g *Group) Exited() error {
	g.mu.Lock()
	procs := append([]*Proc(nil), g.procs...)
	g.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
			p.mu.Lock()
			expected := p.stopping || p.ends
			p.mu.Unlock()
			if !expected {
				return fmt.Errorf("%s exited: %v; the end of %s:\n%s", p.Name, p.err, p.LogPath, p.Tail(10))
			}
		default:
		}
	}
	return nil
}

// Stop ends p: SIGTERM, then SIGKILL to its process group after the grace
// period. It returns when the process has exited.
func (g *Group) Stop(p *Proc) {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	if g.Log != nil {
		g.Log.Info("stopped", "process", p.Name)
	}
}

// StopAll stops every process, newest first.
func (g *Group) StopAll() {
	g.mu.Lock()
	procs := append([]*Proc(nil), g.procs...)
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		g.Stop(procs[i])
	}
}

// Tail returns the last n lines of p's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// CPU returns the CPU time (user and system) used so far by p and every
// process below it (a wrapper script's child counts as the wrapper's).
func (p *Proc) CPU() (time.Duration, error) { return TreeCPU(p.Pid()) }

// clockTick is the kernel's USER_HZ, the unit of /proc/PID/stat's times; it
// is 100 on every Linux architecture Go supports.
const clockTick = 100

// TreeCPU returns the CPU time used by process pid and its live
// descendants, read from /proc.
func TreeCPU(pid int) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	type stat struct{ ppid, ticks int }
	stats := map[int]stat{}
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, ticks, err := readStat(id)
		if err != nil {
			continue // exited since the listing
		}
		stats[id] = stat{ppid, ticks}
	}
	if _, ok := stats[pid]; !ok {
		return 0, fmt.Errorf("childproc: no process %d", pid)
	}
	children := map[int][]int{}
	for id, s := range stats {
		children[s.ppid] = append(children[s.ppid], id)
	}
	total, queue := 0, []int{pid}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		total += stats[id].ticks
		queue = append(queue, children[id]...)
	}
	return time.Duration(total) * time.Second / clockTick, nil
}

// readStat returns a process's parent and its utime+stime in clock ticks.
func readStat(pid int) (ppid, ticks int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("childproc: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("childproc: short /proc/%d/stat", pid)
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.Atoi(f[11])
	st, err3 := strconv.Atoi(f[12])
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, 0, fmt.Errorf("childproc: /proc/%d/stat: %w", pid, err)
	}
	return ppid, ut + st, nil
}
