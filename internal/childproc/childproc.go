// Package childproc starts and stops the child processes of the project's
// commands and tests (engines, Envoys, control planes, etcd and the API
// server, rival routers): each with its output in a log file of its own, in
// its own process group, ended by the kernel if the parent dies, stopped
// gracefully (SIGTERM, then SIGKILL to its whole group after a grace
// period, and to what is left of the group once it exited), newest first. A process can also be killed as in a crash,
// stalled and resumed with signals, and started again with the same command
// line, as the fault drills and the demo do.
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
	// Dir holds one log file per process, NAME.log (StartLog puts one
	// elsewhere).
	Dir string
	// Log, if set, receives a line per start, restart, stop and kill.
	Log *slog.Logger
	// Grace is how long Stop waits after SIGTERM (0: DefaultGrace).
	Grace time.Duration
	// DeathSignal is the signal the kernel sends a child when the parent
	// dies without stopping it (0: SIGTERM; SIGKILL where a child must not
	// linger over a graceful shutdown). Linux only.
	DeathSignal syscall.Signal

	mu    sync.Mutex
	procs []*Proc // guarded by mu
}

// Proc is one child process of a Group. Restart runs it again in place:
// Pid, Done, Err, Running, Signal and CPU are about its current run.
type Proc struct {
	Name string
	// LogPath receives the process's output: its first run truncates it,
	// each restart appends to it.
	LogPath string

	mu  sync.Mutex
	run *run // guarded by mu: the current run
	// stopping is set when the process is stopped or killed on purpose,
	// and cleared when it is restarted.
	stopping bool // guarded by mu
	// ends, when set, marks a process expected to end by itself (a load
	// generator): Exited does not report it.
	ends bool // guarded by mu
}

// run is one run of a Proc.
type run struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
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
	return g.StartLog(name, filepath.Join(g.Dir, name+".log"), cmd)
}

// StartLog is StartCmd with the output in logPath instead of Dir/name.log:
// a file anywhere (the group needs no Dir then), or os.DevNull to discard
// it.
func (g *Group) StartLog(name, logPath string, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, LogPath: logPath}
	if err := g.run(p, cmd, os.O_TRUNC); err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	g.logf("started", p)
	return p, nil
}

// run starts cmd as p's current run, its output written to p's log file
// opened with mode (os.O_TRUNC or os.O_APPEND). The caller holds p.mu or
// owns p alone.
func (g *Group) run(p *Proc, cmd *exec.Cmd, mode int) error {
	f, err := os.OpenFile(p.LogPath, os.O_WRONLY|os.O_CREATE|mode, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr(g.DeathSignal)
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	r := &run{cmd: cmd, done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		f.Close()
		close(r.done)
	}()
	p.run = r
	return nil
}

// Restart starts p again after it ended (stopped, killed, or exited by
// itself), with the same program, arguments, environment and working
// directory (the same ports for a server), its output appended to its log.
// It is an error while p runs.
func (g *Group) Restart(p *Proc) error {
	p.mu.Lock()
	select {
	case <-p.run.done:
	default:
		p.mu.Unlock()
		return fmt.Errorf("childproc: %s is running", p.Name)
	}
	old := p.run.cmd
	cmd := &exec.Cmd{Path: old.Path, Args: old.Args, Env: old.Env, Dir: old.Dir}
	err := g.run(p, cmd, os.O_APPEND)
	if err == nil {
		p.stopping = false
	}
	p.mu.Unlock()
	if err == nil {
		g.logf("restarted", p)
	}
	return err
}

// current returns p's current run.
func (p *Proc) current() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.run
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
func (p *Proc) Pid() int { return p.current().cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.current().done }

// Err is the process's exit error; it waits for the process to exit.
func (p *Proc) Err() error {
	r := p.current()
	<-r.done
	return r.err
}

// Running reports whether the process is up: started and not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.Done():
		return false
	default:
		return true
	}
}

// Signal sends sig to the running process (SIGSTOP stalls it with its
// sockets open, SIGCONT resumes it); an error if it is not running.
func (p *Proc) Signal(sig os.Signal) error {
	r := p.current()
	select {
	case <-r.done:
		return fmt.Errorf("childproc: %s is not running", p.Name)
	default:
	}
	return r.cmd.Process.Signal(sig)
}

// Exited returns an error naming the first process that exited without
// being stopped (and not marked EndsByItself), with the end of its log.
func (g *Group) Exited() error {
	g.mu.Lock()
	procs := append([]*Proc(nil), g.procs...)
	g.mu.Unlock()
	for _, p := range procs {
		p.mu.Lock()
		r, expected := p.run, p.stopping || p.ends
		p.mu.Unlock()
		select {
		case <-r.done:
			if !expected {
				return fmt.Errorf("%s exited: %v; the end of %s:\n%s", p.Name, r.err, p.LogPath, p.Tail(10))
			}
		default:
		}
	}
	return nil
}

// markStopping marks p as ended on purpose and returns its current run,
// or nil when that has exited already.
func (p *Proc) markStopping() *run {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = true
	select {
	case <-p.run.done:
		return nil
	default:
		return p.run
	}
}

// Stop ends p: SIGTERM (after SIGCONT, which a stalled process needs to act
// on it), then SIGKILL to its process group after the grace period; once
// it has exited, SIGKILL to what is left of its group (a wrapper's
// children that outlived it). It returns when the process has exited.
func (g *Group) Stop(p *Proc) {
	r := p.markStopping()
	if r == nil {
		return
	}
	pgid := r.cmd.Process.Pid
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-r.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	g.logf("stopped", p)
}

// Kill ends p at once, as a crash: SIGKILL to its process group, no
// graceful stop, the kernel closes its sockets. It returns when the
// process has exited; like Stop, Exited does not report it.
func (g *Group) Kill(p *Proc) {
	r := p.markStopping()
	if r == nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.done
	g.logf("killed", p)
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

// logf writes a line about p to the group's logger, if any.
func (g *Group) logf(what string, p *Proc) {
	if g.Log == nil {
		return
	}
	if what == "started" || what == "restarted" {
		g.Log.Info(what, "process", p.Name, "pid", p.Pid(), "log", p.LogPath)
		return
	}
	g.Log.Info(what, "process", p.Name)
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
