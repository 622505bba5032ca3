package opcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
)

func TestValidateExamples(t *testing.T) {
	var out, errOut bytes.Buffer
	files := []string{"../../../examples/fleet-3region.yaml", "../../../examples/fleet-minimal.yaml"}
	if err := runValidate(&out, &errOut, files, nil); err != nil {
		t.Fatalf("validate: %v\n%s", err, errOut.String())
	}
	want := "../../../examples/fleet-3region.yaml: ok: fleet \"demo-3region\": 3 regions, 3 frontends, 12 engines (7 A100, 5 H100), 3 classes, 1 model (llama-3.1-8b), 3 priorities\n"
	if !strings.HasPrefix(out.String(), want) || strings.Count(out.String(), "\n") != 2 || errOut.Len() != 0 {
		t.Errorf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	src, err := os.ReadFile("../../../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(src), "region: local, gpu: H100", "region: locl, gpu: L40S", 1)
	bad = strings.Replace(bad, "kv_capacity_tokens: 450000", "kv_capacity_tokens: 450000\n    colour: red", 1)
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = runValidate(&out, &errOut, []string{path}, nil)
	if err == nil {
		t.Fatal("invalid spec accepted")
	}
	// Line numbers in the edited copy of fleet-minimal.yaml.
	want := path + ":23: profiles[0].colour: unknown key\n" +
		path + `:28: engines[0].region: unknown region "locl" (known: "local")` + "\n" +
		path + `:28: engines[0].gpu: no profile for gpu "L40S" and model "llama-3.1-8b"` + "\n"
	if errOut.String() != want || out.Len() != 0 {
		t.Errorf("stderr:\n%s\nwant:\n%s\nstdout:\n%s", errOut.String(), want, out.String())
	}
	// A missing file is reported as such, and the others still checked.
	out.Reset()
	errOut.Reset()
	err = runValidate(&out, &errOut, []string{filepath.Join(t.TempDir(), "nope.yaml"), "../../../examples/fleet-minimal.yaml"}, nil)
	if err == nil || err.Error() != "1 of 2 files invalid" || !strings.Contains(errOut.String(), "no such file") || !strings.Contains(out.String(), "fleet-minimal.yaml: ok") {
		t.Errorf("err %v\nstdout %s\nstderr %s", err, out.String(), errOut.String())
	}
}

// A demand file is recognized and checked: on its own, and against a fleet
// whose names it must use.
func TestValidateDemandFiles(t *testing.T) {
	spec, err := fleet.Load("../../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	other, err := fleet.Load("../../../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	demand := "../../../examples/demand-3region.yaml"
	for _, c := range []struct {
		spec    *fleet.Spec
		wantOut string
		wantErr string
	}{
		{nil, "demand-3region.yaml: ok: demand file: 5 (frontend, class) entries, 2 engine states; names not checked (give --fleet)", ""},
		{spec, `ok: demand file: 5 (frontend, class) entries, 2 engine states, consistent with fleet "demo-3region"`, ""},
		{other, "", `against fleet "minimal"`},
	} {
		var out, errOut bytes.Buffer
		err := runValidate(&out, &errOut, []string{demand}, c.spec)
		if c.wantErr == "" && (err != nil || !strings.Contains(out.String(), c.wantOut)) {
			t.Errorf("fleet %v: err %v, stdout %q, stderr %q; want %q", c.spec != nil, err, out.String(), errOut.String(), c.wantOut)
		}
		if c.wantErr != "" && (err == nil || !strings.Contains(errOut.String(), c.wantErr)) {
			t.Errorf("against the wrong fleet: err %v, stderr %q; want %q", err, errOut.String(), c.wantErr)
		}
	}
}
