package extproc_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// The official OpenAI Python client, through Envoy and ext_proc: a request
// is served, and the balancer's errors reach the caller as the client's typed
// exceptions with our messages (404 unknown model, 429 shed with
// Retry-After, 400 unknown priority). The client serializes "messages"
// before "model", which is why the whole body is read.
func TestOpenAIPythonClient(t *testing.T) {
	noLeaks(t)
	venv, err := envoytest.Venv()
	if err != nil {
		t.Skipf("no venv: %v", err)
	}
	py := filepath.Join(venv, "bin", "python")
	if err := exec.Command(py, "-c", "import openai").Run(); err != nil {
		t.Skipf("no OpenAI client in %s (run scripts/setup.sh)", venv)
	}
	r := startRig(t, rigOptions{policy: func(p *policyv1.RoutingPolicy) {
		p.Classes[0].ShedFractionByLevel = map[uint32]float64{2: 1}
	}})
	script := `
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0)
msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
r = c.chat.completions.with_raw_response.create(model="llama-3-8b", messages=msgs, max_tokens=4)
print("ok", r.status_code)
def expect(exc, **kw):
    try:
        c.chat.completions.create(messages=msgs, **kw)
    except exc as e:
        print(type(e).__name__, e.status_code, e.response.headers.get("retry-after"), "|", e.message)
        return
    print("no error for", kw)
expect(openai.NotFoundError, model="gpt-9")
expect(openai.RateLimitError, model="llama-3-8b", extra_headers={"x-priority": "batch"})
expect(openai.BadRequestError, model="llama-3-8b", extra_headers={"x-priority": "vip"})
`
	out, err := exec.Command(py, "-c", script, r.url).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	got := string(out)
	t.Logf("OpenAI client:\n%s", got)
	for _, want := range []string{
		"ok 200",
		`NotFoundError 404 None | Error code: 404 - {'error': {'message': 'The model "gpt-9" does not exist`,
		"RateLimitError 429 1 |",
		`BadRequestError 400 None | Error code: 400 - {'error': {'message': 'Unknown priority "vip"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
