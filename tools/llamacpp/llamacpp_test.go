package llamacpp

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoyrun"
)

// The test binary plays llama-server when LLAMACPP_FAKE_SERVER is set: it
// answers /health on --host and --port, so the Server's process handling is
// tested where llama.cpp is not built.
func TestMain(m *testing.M) {
	if os.Getenv("LLAMACPP_FAKE_SERVER") == "1" {
		fakeServer(os.Args[1:])
		return
	}
	os.Exit(m.Run())
}

func fakeServer(args []string) {
	var host, port string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--host":
			host = args[i+1]
		case "--port":
			port = args[i+1]
		}
	}
	fmt.Println("fake llama-server listening on", host+":"+port)
	http.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, `{"status":"ok"}`) })
	fmt.Println(http.ListenAndServe(host+":"+port, nil))
	os.Exit(1)
}

// A server is killed, restarted on its port, stalled, resumed and stopped
// (the drills' faults); a restart appends to its log.
func TestServerKillRestartPauseStop(t *testing.T) {
	defer leaktest.AfterTest(t)()
	dir := t.TempDir()
	model := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(model, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERLB_LLAMA_SERVER", os.Args[0])
	t.Setenv("LLAMACPP_FAKE_SERVER", "1")
	logPath := filepath.Join(dir, "server.log")
	s, err := Start(context.Background(), Options{Model: model, LogPath: logPath, StartTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	client := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	health := func() error { return s.health(client) }
	if err := health(); err != nil || !s.Running() {
		t.Fatalf("after Start: health %v, running %v", err, s.Running())
	}
	if err := s.Restart(context.Background()); err == nil {
		t.Fatal("Restart of a running server: no error")
	}

	addr := s.Addr()
	s.Kill()
	if s.Running() || health() == nil {
		t.Fatal("the killed server still answers")
	}
	if err := s.Pause(); err == nil {
		t.Fatal("Pause of a killed server: no error")
	}
	if err := s.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr || health() != nil {
		t.Fatalf("after Restart: %s (was %s), health %v", s.Addr(), addr, health())
	}
	if b, _ := os.ReadFile(logPath); strings.Count(string(b), "listening on "+addr) != 2 {
		t.Fatalf("log %q: want both runs", b)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	// SIGSTOP takes effect asynchronously: wait for the stopped state.
	if err := envoyrun.Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.proc.Pid()))
		if err != nil || !strings.Contains(string(b), ") T ") {
			return fmt.Errorf("not stopped: %q %v", b, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := health(); err == nil {
		t.Fatal("a paused server answers")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := health(); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	// A paused server stops at once (resumed to take SIGTERM), not after
	// the grace period.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("running after Stop")
	}
	if err := s.proc.Err(); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Fatalf("stopped with %v, want SIGTERM", err)
	}
}

// Without a log path the output is discarded.
func TestServerWithoutLog(t *testing.T) {
	defer leaktest.AfterTest(t)()
	model := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(model, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("INFERLB_LLAMA_SERVER", os.Args[0])
	t.Setenv("LLAMACPP_FAKE_SERVER", "1")
	s, err := Start(context.Background(), Options{Model: model, StartTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if s.proc.LogPath != os.DevNull {
		t.Fatalf("log %s, want %s", s.proc.LogPath, os.DevNull)
	}
}
