package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// internal/grpcenv's settings reach gRPC only if it is initialized before
// gRPC reads its environment: the runtime's init trace of this binary
// (GODEBUG=inittrace=1) shows it first.
func TestGRPCEnvBeforeGRPC(t *testing.T) {
	cmd := exec.Command(os.Args[0], "--help")
	cmd.Env = append(os.Environ(), runAsMain+"=1", "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	ours, theirs := -1, -1
	for i, line := range strings.Split(stderr.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "init github.com/inferlb/inferlb/internal/grpcenv "):
			ours = i
		case strings.HasPrefix(line, "init google.golang.org/grpc/internal/envconfig "):
			theirs = i
		}
	}
	if ours < 0 || theirs < 0 || ours > theirs {
		t.Fatalf("init order: grpcenv at line %d, gRPC's envconfig at %d (want grpcenv first)\n%s", ours, theirs, stderr.String())
	}
}
