package auth

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// checkEvery is how often, at most, the credential files are looked at
// again (a stat each; a read when one changed or the last read failed).
const checkEvery = time.Second

// file is one credential file and the flag that names it.
type file struct{ flag, path string }

// watched is what parse made of a set of files (a token file; a
// certificate and its key; a CA), looked at again at most once per
// checkEvery when it is used, and re-read when one file's identity,
// modification time or size changed, so credentials rotate without a
// restart. A file that cannot be read or parsed keeps the last good value:
// the port must neither open nor lock everyone out on a failed rotation.
// While the files are bad they are re-read at every check (a certificate
// written before its key is a mismatched pair until the key lands: "not
// yet", never wedged), and the failure is reported once per change of the
// files, not once a second.
type watched[T any] struct {
	files  []file
	what   string // the files' flags, for reports: "--tls-cert/--tls-key"
	parse  func(contents [][]byte) (T, error)
	report func(what string, err error) // nil: not reported

	// mu guards the fields below.
	mu      sync.Mutex
	val     T
	seen    []os.FileInfo // the files as last read (nil: stat failed)
	failing bool          // the files as seen were refused: retry
	checked time.Time
}

// newWatched reads the files; an error here (at start) is returned, not
// reported: there is no last good value to keep.
func newWatched[T any](files []file, parse func([][]byte) (T, error), report func(string, error)) (*watched[T], error) {
	flags := make([]string, len(files))
	for i, f := range files {
		flags[i] = f.flag
	}
	w := &watched[T]{files: files, what: strings.Join(flags, "/"), parse: parse, report: report}
	if err := w.read(w.stat()); err != nil {
		return nil, err
	}
	w.checked = time.Now()
	return w, nil
}

// current returns the value, after looking at the files if checkEvery
// passed since the last look.
func (w *watched[T]) current() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := time.Now(); now.Sub(w.checked) >= checkEvery {
		w.checked = now
		w.check()
	}
	return w.val
}

// check re-reads the files if they changed or were refused; w.mu is held.
func (w *watched[T]) check() {
	st := w.stat()
	changed := false
	for i := range st {
		changed = changed || !same(st[i], w.seen[i])
	}
	if !changed && !w.failing {
		return
	}
	err := w.read(st)
	w.failing = err != nil
	if w.report != nil && (changed || err == nil) {
		w.report(w.what, err)
	}
}

// stat returns each file's FileInfo, nil for a file it cannot stat (read
// then says why).
func (w *watched[T]) stat() []os.FileInfo {
	st := make([]os.FileInfo, len(w.files))
	for i, f := range w.files {
		st[i], _ = os.Stat(f.path)
	}
	return st
}

// read reads and parses the files and takes the value if it is good. The
// files are stat'ed (st) before they are read, so a write landing between
// the two is seen as a change at the next check.
func (w *watched[T]) read(st []os.FileInfo) error {
	w.seen = st
	contents := make([][]byte, len(w.files))
	for i, f := range w.files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.flag, err)
		}
		contents[i] = b
	}
	v, err := w.parse(contents)
	if err != nil {
		return err
	}
	w.val = v
	return nil
}

// same reports whether a and b are the same file unchanged (a rotation by
// rename or by Kubernetes' symlink swap gives another file; one in place,
// another modification time or size).
func same(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// ReloadMetrics returns a Server's or Client's Reloaded hook that logs
// every reload of changed credential files (Info when the new content is
// taken, Error naming the file when it is refused and the last good
// content stays) and counts the refusals in reg:
// inferlb_auth_reload_errors_total{files} and, 1 while the files' latest
// content is refused, inferlb_auth_reload_failing{files}.
func ReloadMetrics(reg prometheus.Registerer, log *slog.Logger) (func(files string, err error), error) {
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_auth_reload_errors_total",
		Help: "Changed credential files (TLS certificate and key, CA, token file) refused: the last good content stays. By the files' flags."}, []string{"files"})
	failing := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_auth_reload_failing",
		Help: "1 while the latest content of credential files is refused (the last good content is in use), by the files' flags."}, []string{"files"})
	for _, c := range []prometheus.Collector{errs, failing} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("auth reload metrics: %w", err)
		}
	}
	return func(files string, err error) {
		if err != nil {
			errs.WithLabelValues(files).Inc()
			failing.WithLabelValues(files).Set(1)
			log.Error("auth: changed credential files refused; the last good ones stay in use", "files", files, "err", err)
			return
		}
		failing.WithLabelValues(files).Set(0)
		log.Info("auth: credential files reloaded", "files", files)
	}, nil
}
