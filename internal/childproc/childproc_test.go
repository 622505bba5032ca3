package childproc

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
)

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
	g.Stop(sleeper)
	select {
	case <-sleeper.Done():
	default:
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
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Tail(1), "ready") {
		if time.Now().After(deadline) {
			t.Fatal("the child never started")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.Stop(p)
	if p.Err() == nil {
		t.Fatal("a process killed after its grace reports a clean exit")
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

func TestTreeCPUCountsDescendants(t *testing.T) {
	defer leaktest.AfterTest(t)()
	g := &Group{Dir: t.TempDir(), Grace: time.Second}
	defer g.StopAll()
	// The wrapper does nothing; its child spins.
	p, err := g.Start("wrapper", "sh", "-c", "sh -c 'while :; do :; done' & wait")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		cpu, err := p.CPU()
		if err != nil {
			t.Fatal(err)
		}
		if cpu >= 100*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tree's CPU stayed at %v", cpu)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
