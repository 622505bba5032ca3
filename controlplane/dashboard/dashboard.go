// Package dashboard is the control plane's web dashboard: a static page
// (HTML, CSS, JavaScript and the vendored uPlot chart library) embedded in
// the binary and served on the admin listener. The page draws what the
// admin JSON endpoints say (/weights, /signals, /history, /explain): it has
// no server-side logic of its own and needs no build step.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// UPlotVersion is the version of the vendored chart library
// (static/vendor/uplot, from the npm package uplot).
const UPlotVersion = "1.6.32"

//go:embed static
var files embed.FS

// Handler serves the dashboard's files under prefix (such as
// "/dashboard/"): the page at prefix itself, its script, style sheet and the
// chart library beside it.
func Handler(prefix string) http.Handler {
	sub, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	fsrv := http.StripPrefix(prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Directory listings are not part of the page.
		if r.URL.Path != prefix && strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		// The page and its scripts come from here only; it talks to the
		// admin server that served it and nowhere else.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		// An upgraded binary serves new files at the same URLs.
		h.Set("Cache-Control", "no-cache")
		fsrv.ServeHTTP(w, r)
	})
}
