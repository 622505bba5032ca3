// Package envoybin finds the Envoy binary and the Python virtual environment
// that scripts/setup.sh installs, for commands (the demo, benchmarks) and
// tests alike.
package envoybin

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// ErrNoEnvoy is returned by Binary when no Envoy can be found.
var ErrNoEnvoy = errors.New("no envoy binary found (run scripts/setup.sh or make setup, or set INFERLB_ENVOY)")

// Binary returns the Envoy to run: $INFERLB_ENVOY, else $INFERLB_VENV/bin/envoy,
// else .venv/bin/envoy in the working directory or the source tree, else
// envoy on PATH.
func Binary() (string, error) {
	if p := os.Getenv("INFERLB_ENVOY"); p != "" {
		return p, nil
	}
	for _, v := range venvCandidates() {
		if p := filepath.Join(v, "bin", "envoy"); isExec(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	return "", ErrNoEnvoy
}

// Venv returns the project's Python virtual environment directory:
// $INFERLB_VENV, else the first .venv found in the working directory or the
// source tree, else ".venv".
func Venv() string {
	for _, v := range venvCandidates() {
		if isExec(filepath.Join(v, "bin", "python")) {
			return v
		}
	}
	if v := os.Getenv("INFERLB_VENV"); v != "" {
		return v
	}
	return ".venv"
}

func venvCandidates() []string {
	var c []string
	if v := os.Getenv("INFERLB_VENV"); v != "" {
		c = append(c, v)
	}
	if wd, err := os.Getwd(); err == nil {
		c = append(c, filepath.Join(wd, ".venv"))
	}
	if root, err := RepoRoot(); err == nil {
		c = append(c, filepath.Join(root, ".venv"))
	}
	return c
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// RepoRoot walks up from this source file to the directory holding go.mod.
// It works for tests and for binaries built from a checkout.
func RepoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("envoybin: no caller")
	}
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("envoybin: go.mod not found above " + filepath.Dir(file))
		}
		dir = parent
	}
}
