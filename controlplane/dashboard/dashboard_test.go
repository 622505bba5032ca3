package dashboard

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The page, its script and style and the vendored chart library (with its
// licence) are served from the binary under the prefix, with a policy that
// keeps the page to its own origin; directories are not listed.
func TestHandlerServesTheEmbeddedPage(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET /dashboard/", Handler("/dashboard/"))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct {
		path, ctype, body string
		status            int
	}{
		{"/dashboard/", "text/html", "<title>inferlb control plane</title>", 200},
		{"/dashboard/dashboard.js", "text/javascript", "../explain?node=", 200},
		{"/dashboard/dashboard.css", "text/css", "table.heatmap", 200},
		{"/dashboard/vendor/uplot/uPlot.iife.min.js", "text/javascript", "uPlot (v" + UPlotVersion + ")", 200},
		{"/dashboard/vendor/uplot/uPlot.min.css", "text/css", ".uplot", 200},
		{"/dashboard/vendor/uplot/LICENSE", "text/plain", "The MIT License (MIT)", 200},
		{"/dashboard/vendor/uplot/README.md", "", "uPlot " + UPlotVersion, 200},
		{"/dashboard/vendor/", "", "", 404},
		{"/dashboard/nope.js", "", "", 404},
	} {
		resp, err := http.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s: %s, want %d", c.path, resp.Status, c.status)
			continue
		}
		if c.status != 200 {
			continue
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, c.ctype) {
			t.Errorf("GET %s: content type %q, want %s", c.path, ct, c.ctype)
		}
		if !strings.Contains(string(b), c.body) {
			t.Errorf("GET %s: the body lacks %q", c.path, c.body)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
	}
}
