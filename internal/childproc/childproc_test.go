package childproc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
)

// poll calls f every 10 ms until it returns nil, and fails the test with
// f's last error once timeout has passed.
func poll(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("after %v: %v", timeout, err)
		case <-tick.C:
		}
	}
}

// logHas polls until p's log holds s.
func logHas(t *testing.T, p *Proc, s string) {
	t.Helper()
	poll(t, 10*time.Second, func() error {
		if b, _ := os.ReadFile(p.LogPath); !strings.Contains(string(b), s) {
			return fmt.Errorf("%s's log %q lacks %q", p.Name, b, s)
		}
		return nil
	})
}

// state is a process's state letter in /proc (R, S, T stopped, Z zombie),
// or "" when there is no such process.
func state(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// exitSignal is the signal that ended a process, from its exit error (0
// when none did).
func exitSignal(err error) syscall.Signal {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0
	}
	return ee.Sys().(syscall.WaitStatus).Signal()
}

// gone reports whether pid has exited (a zombie not yet reaped by its new
// parent counts as gone).
func gone(pid int) error {
	if st := state(pid); st != "" && st != "Z" {
		return fmt.Errorf("process %d is still there (state %s)", pid, st)
	}
	return nil
}

func TestGroupStartStopAndExited(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: 2 * time.Second}
	defer g.StopAll()
	sleeper, err := g.Start("sleeper", "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	quitter, err := g.Start("quitter", "sh", "-c", "echo going away; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	<-quitter.Done()
	err = g.Exited()
	if err == nil || !strings.Contains(err.Error(), "quitter exited") || !strings.Contains(err.Error(), "going away") {
		t.Fatalf("Exited = %v, want quitter's exit with its log", err)
	}
	g.Stop(quitter)
	if err := g.Exited(); err != nil {
		t.Fatalf("a stopped process is reported: %v", err)
	}
	if !sleeper.Running() {
		t.Fatal("the sleeper is not running")
	}
	g.Stop(sleeper)
	if sleeper.Running() {
		t.Fatal("Stop returned before the process ended")
	}
	if err := g.Exited(); err != nil {
		t.Fatalf("after StopAll: %v", err)
	}
}

func TestStopKillsAfterGrace(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: 200 * time.Millisecond}
	p, err := g.Start("stubborn", "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done")
	if err != nil {
		t.Fatal(err)
	}
	logHas(t, p, "ready")
	g.Stop(p)
	if p.Err() == nil {
		t.Fatal("a process killed after its grace reports a clean exit")
	}
}

// A wrapper leaves no child behind: Stop ends what is left of its process
// group once the wrapper exits on SIGTERM, Kill ends the whole group at
// once, as a crash. Neither is an unexpected exit.
func TestStopAndKillEndTheGroup(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(*Group, *Proc)
		want syscall.Signal
	}{
		{"stop", (*Group).Stop, syscall.SIGTERM},
		{"kill", (*Group).Kill, syscall.SIGKILL},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer leaktest.AfterTest(t)()
			g := &Group{Dir: t.TempDir(), Grace: time.Minute}
			defer g.StopAll()
			p, err := g.Start("wrapper", "sh", "-c", "sleep 60 & echo child $!; wait")
			if err != nil {
				t.Fatal(err)
			}
			child := childPid(t, p)
			c.end(g, p)
			if err := p.Err(); exitSignal(err) != c.want {
				t.Fatalf("the wrapper ended with %v, want %v", err, c.want)
			}
			poll(t, 10*time.Second, func() error { return gone(child) })
			if err := g.Exited(); err != nil {
				t.Fatalf("reported: %v", err)
			}
		})
	}
}

// childPid waits for the "child PID" line a wrapper writes and returns
// the PID.
func childPid(t *testing.T, p *Proc) int {
	t.Helper()
	logHas(t, p, "child ")
	f := strings.Fields(p.Tail(1))
	pid, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		t.Fatalf("no child pid in %q", p.Tail(1))
	}
	return pid
}

// A stalled process acts on SIGTERM only once continued: Stop resumes it,
// so it ends by SIGTERM at once rather than by SIGKILL after the grace.
func TestSignalStallsAndResumes(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: time.Minute}
	defer g.StopAll()
	p, err := g.Start("sleeper", "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	want := func(st string) func() error {
		return func() error {
			if got := state(p.Pid()); got != st {
				return fmt.Errorf("state %q, want %q", got, st)
			}
			return nil
		}
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, want("T"))
	if err := p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, want("S"))
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, want("T"))
	g.Stop(p)
	if err := p.Err(); exitSignal(err) != syscall.SIGTERM {
		t.Fatalf("a stalled process stopped with %v, want SIGTERM", err)
	}
	if err := p.Signal(syscall.SIGCONT); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("Signal to an ended process: %v, want not running", err)
	}
}

// Restart runs the same program, arguments, environment and working
// directory again, appending to the same log; Exited reports the new run.
func TestRestartRunsTheSameCommand(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: 2 * time.Second}
	defer g.StopAll()
	work := t.TempDir()
	cmd := exec.Command("sh", "-c", `echo "run $RUN in $(pwd)"; exec sleep 60`)
	cmd.Env = append(os.Environ(), "RUN=again")
	cmd.Dir = work
	p, err := g.StartCmd("server", cmd)
	if err != nil {
		t.Fatal(err)
	}
	line := "run again in " + work
	logHas(t, p, line)
	if err := g.Restart(p); err == nil || !strings.Contains(err.Error(), "server is running") {
		t.Fatalf("Restart of a running process: %v, want an error", err)
	}
	first := p.Pid()
	g.Kill(p)
	if p.Running() {
		t.Fatal("running after Kill")
	}
	if err := g.Restart(p); err != nil {
		t.Fatal(err)
	}
	if p.Pid() == first || !p.Running() {
		t.Fatalf("after Restart: pid %d (was %d), running %v", p.Pid(), first, p.Running())
	}
	poll(t, 10*time.Second, func() error {
		if b, _ := os.ReadFile(p.LogPath); strings.Count(string(b), line) != 2 {
			return fmt.Errorf("log %q: want %q twice", b, line)
		}
		return nil
	})
	// The new run is watched: its unexpected end is reported.
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if err := g.Exited(); err == nil || !strings.Contains(err.Error(), "server exited") {
		t.Fatalf("Exited after the restarted run died = %v", err)
	}
}

// StartLog puts the output anywhere, or nowhere (os.DevNull), and needs no
// directory.
func TestStartLog(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{}
	defer g.StopAll()
	path := filepath.Join(t.TempDir(), "elsewhere.txt")
	p, err := g.StartLog("talker", path, exec.Command("echo", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	p.EndsByItself()
	<-p.Done()
	if got := p.Tail(5); got != "hello" {
		t.Fatalf("log %q, want hello", got)
	}
	q, err := g.StartLog("quiet", os.DevNull, exec.Command("echo", "nobody hears"))
	if err != nil {
		t.Fatal(err)
	}
	q.EndsByItself()
	if err := q.Err(); err != nil || q.Tail(5) != "" {
		t.Fatalf("discarded output: err %v, tail %q", err, q.Tail(5))
	}
}

func TestEndsByItself(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir()}
	p, err := g.Start("job", "true")
	if err != nil {
		t.Fatal(err)
	}
	p.EndsByItself()
	<-p.Done()
	if err := g.Exited(); err != nil {
		t.Fatalf("a process that ends by itself is reported: %v", err)
	}
}

// A parent that dies without stopping its children (SIGKILL, a test's
// timeout) takes them with it: the kernel sends each the group's
// DeathSignal, SIGKILL ending even a child that ignores SIGTERM.
func TestChildrenDieWithTheParent(t *testing.T) {
	if sig := os.Getenv("CHILDPROC_HELPER"); sig != "" {
		// The helper plays the parent: it starts a child and waits to be
		// killed.
		g := &Group{Dir: os.Getenv("CHILDPROC_DIR")}
		script := "echo ready; exec sleep 300"
		if sig == "KILL" {
			g.DeathSignal = syscall.SIGKILL
			script = "trap '' TERM; " + script
		}
		p, err := g.Start("child", "sh", "-c", script)
		if err != nil {
			t.Fatal(err)
		}
		logHas(t, p, "ready")
		fmt.Printf("child %d\n", p.Pid())
		select {}
	}
	for _, sig := range []string{"TERM", "KILL"} {
		t.Run(sig, func(t *testing.T) {
			helper := exec.Command(os.Args[0], "-test.run=^TestChildrenDieWithTheParent$")
			helper.Env = append(os.Environ(), "CHILDPROC_HELPER="+sig, "CHILDPROC_DIR="+t.TempDir())
			out, err := helper.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			var child int
			_, err = fmt.Fscanf(bufio.NewReader(out), "child %d\n", &child)
			helper.Process.Kill()
			helper.Wait()
			if err != nil {
				t.Fatalf("the helper did not start its child: %v", err)
			}
			defer syscall.Kill(child, syscall.SIGKILL)
			poll(t, 10*time.Second, func() error { return gone(child) })
		})
	}
}

func TestTreeCPUCountsDescendants(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: time.Second}
	// The wrapper does nothing; its child spins (and ends with the
	// wrapper's group).
	p, err := g.Start("wrapper", "sh", "-c", "sh -c 'while :; do :; done' & echo child $!; wait")
	if err != nil {
		t.Fatal(err)
	}
	spinner := childPid(t, p)
	defer func() {
		g.StopAll()
		poll(t, 10*time.Second, func() error { return gone(spinner) })
	}()
	poll(t, 20*time.Second, func() error {
		cpu, err := p.CPU()
		if err != nil {
			return err
		}
		if cpu < 100*time.Millisecond {
			return fmt.Errorf("the tree's CPU is %v", cpu)
		}
		return nil
	})
	if _, err := TreeCPU(1 << 30); err == nil {
		t.Fatal("TreeCPU of no process: no error")
	}
}

func TestStartNeedsADirectory(t *testing.T) {
	g := &Group{}
	if _, err := g.Start("x", "true"); err == nil {
		t.Fatal("no error without a log directory")
	}
	g = &Group{Dir: t.TempDir()}
	if _, err := g.Start("x", "/no/such/binary"); err == nil || !strings.Contains(err.Error(), "start x") {
		t.Fatalf("err = %v, want start x: ...", err)
	}
	if _, err := os.Stat(g.Dir + "/x.log"); err != nil {
		t.Fatal(err)
	}
}
