package auth

import (
	"crypto/x509"
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
// A watcher copies it when it is made (tests shorten it).
var checkEvery = time.Second

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
	report *Reloads      // nil: not reported
	every  time.Duration // checkEvery

	// mu guards the fields below.
	mu      sync.Mutex
	val     T
	seen    []os.FileInfo // the files as last read (nil: stat failed)
	failing bool          // the files as seen were refused: retry
	checked time.Time
}

// newWatched reads the files; an error here (at start) is returned, not
// reported: there is no last good value to keep.
func newWatched[T any](files []file, parse func([][]byte) (T, error), report *Reloads) (*watched[T], error) {
	flags := make([]string, len(files))
	for i, f := range files {
		flags[i] = f.flag
	}
	w := &watched[T]{files: files, what: strings.Join(flags, "/"), parse: parse, report: report, every: checkEvery}
	if err := w.read(w.stat()); err != nil {
		return nil, err
	}
	w.checked = time.Now()
	return w, nil
}

// current returns the value, after looking at the files if w.every
// passed since the last look.
func (w *watched[T]) current() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := time.Now(); now.Sub(w.checked) >= w.every {
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
	if changed || err == nil {
		w.report.report(w.what, err)
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

// Reloads reports the reloads of credential files: it logs every one
// (Info when the new content is taken, Error naming the file when it is
// refused and the last good content stays) and counts the refusals. As a
// Prometheus collector it also looks at every watched file when scraped,
// so that a refused rotation shows (and is logged) without waiting for the
// next handshake, and it exports each certificate's expiry:
//
//	inferlb_auth_reload_errors_total{files}   changed files refused
//	inferlb_auth_reload_failing{files}        1 while their latest content is refused
//	inferlb_auth_certificate_expiry_timestamp_seconds{files}  NotAfter of the certificate in use
//
// files are the flags, e.g. "--tls-cert/--tls-key". A nil *Reloads
// reports nothing.
type Reloads struct {
	log     *slog.Logger
	errs    *prometheus.CounterVec
	failing *prometheus.GaugeVec
	expiry  *prometheus.Desc

	// mu guards watchers.
	mu       sync.Mutex
	watchers []func() (files string, leaf *x509.Certificate)
}

// NewReloads registers a Reloads in reg.
func NewReloads(reg prometheus.Registerer, log *slog.Logger) (*Reloads, error) {
	r := &Reloads{log: log,
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_auth_reload_errors_total",
			Help: "Changed credential files (TLS certificate and key, CA, token file) refused: the last good content stays. By the files' flags."}, []string{"files"}),
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_auth_reload_failing",
			Help: "1 while the latest content of credential files is refused (the last good content is in use), by the files' flags."}, []string{"files"}),
		expiry: prometheus.NewDesc("inferlb_auth_certificate_expiry_timestamp_seconds",
			"When the TLS certificate in use expires (NotAfter, Unix seconds), by its files' flags.", []string{"files"}, nil),
	}
	if err := reg.Register(r); err != nil {
		return nil, fmt.Errorf("auth reload metrics: %w", err)
	}
	return r, nil
}

// Describe implements prometheus.Collector.
func (r *Reloads) Describe(ch chan<- *prometheus.Desc) {
	r.errs.Describe(ch)
	r.failing.Describe(ch)
	ch <- r.expiry
}

// Collect looks at the watched files, then exports the metrics.
func (r *Reloads) Collect(ch chan<- prometheus.Metric) {
	r.mu.Lock()
	ws := r.watchers
	r.mu.Unlock()
	// One series per files label: a second Options or DialOptions on the
	// same Reloads watches the same files again.
	expiry := map[string]time.Time{}
	for _, w := range ws {
		if files, leaf := w(); leaf != nil {
			expiry[files] = leaf.NotAfter
		}
	}
	for files, t := range expiry {
		ch <- prometheus.MustNewConstMetric(r.expiry, prometheus.GaugeValue, float64(t.Unix()), files)
	}
	r.errs.Collect(ch)
	r.failing.Collect(ch)
}

// report logs and counts one reload.
func (r *Reloads) report(files string, err error) {
	if r == nil {
		return
	}
	if err != nil {
		r.errs.WithLabelValues(files).Inc()
		r.failing.WithLabelValues(files).Set(1)
		r.log.Error("auth: changed credential files refused; the last good ones stay in use", "files", files, "err", err)
		return
	}
	r.failing.WithLabelValues(files).Set(0)
	r.log.Info("auth: credential files reloaded", "files", files)
}

// watch makes a scrape look at w's files; leaf gives the certificate of
// its value, if it has one.
func watch[T any](r *Reloads, w *watched[T], leaf func(T) *x509.Certificate) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watchers = append(r.watchers, func() (string, *x509.Certificate) {
		v := w.current()
		if leaf == nil {
			return w.what, nil
		}
		return w.what, leaf(v)
	})
}
