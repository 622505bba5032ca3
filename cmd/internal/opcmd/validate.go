package opcmd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
)

func newValidateCmd() *cobra.Command {
	var fleetPath string
	cmd := &cobra.Command{
		Use:   "validate FILE...",
		Short: "Check fleet specs (and demand files) and summarize them",
		Long: `validate parses each FILE (YAML) with the same defaults and rules every
inferlb component uses. A FILE is a fleet spec (docs/fleet-spec.md), or a
demand file for inferlb solve (a top-level demand: key; docs/optimizer.md),
which is checked on its own, and against the fleet of --fleet when given.

A valid file prints one line: the file and a summary (for a fleet: regions,
frontends, engines by GPU type, classes, models, priorities). An invalid file
prints every problem on its own line, as FILE:LINE: PATH: PROBLEM, e.g.

  fleet.yaml:42: engines[3].region: unknown region "eu-wst"

and the command exits with status 1. A model's tokenizer (models[].tokenizer)
is parsed with the loader ext_proc uses, so a tokenizer.json it cannot use is
reported here.`,
		Example: `  inferlb validate examples/fleet-3region.yaml
  inferlb validate examples/*.yaml
  inferlb validate --fleet examples/fleet-3region.yaml examples/demand-3region.yaml`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var spec *fleet.Spec
			if fleetPath != "" {
				var err error
				if spec, err = fleet.Load(fleetPath); err != nil {
					return fmt.Errorf("--fleet: %w", err)
				}
			}
			return runValidate(cmd.OutOrStdout(), cmd.ErrOrStderr(), args, spec)
		},
	}
	cmd.Flags().StringVar(&fleetPath, "fleet", "", "fleet spec to check demand files against")
	return cmd
}

// runValidate checks each file: summaries go to out, problems to errOut.
// Demand files are checked against spec when it is not nil. It returns an
// error if any file is invalid.
func runValidate(out, errOut io.Writer, files []string, spec *fleet.Spec) error {
	bad, kind := 0, "fleet spec"
	for _, file := range files {
		if isDemandFile(file) {
			if sum, err := checkDemand(file, spec); err != nil {
				bad, kind = bad+1, "demand file"
				fmt.Fprintln(errOut, err)
			} else {
				fmt.Fprintf(out, "%s: ok: %s\n", file, sum)
			}
			continue
		}
		s, err := fleet.Check(file)
		if err == nil {
			fmt.Fprintf(out, "%s: ok: %s\n", file, s.Summary())
			continue
		}
		bad++
		fes := fleet.Errors(err)
		if len(fes) == 0 { // not a spec problem (unreadable file)
			fmt.Fprintln(errOut, err)
			continue
		}
		for _, fe := range fes {
			loc := file
			if fe.Line > 0 {
				loc = fmt.Sprintf("%s:%d", file, fe.Line)
			}
			fmt.Fprintf(errOut, "%s: %s\n", loc, fe.Error())
		}
	}
	switch {
	case bad == 0:
		return nil
	case len(files) == 1:
		return errors.New("invalid " + kind)
	default:
		return fmt.Errorf("%d of %d files invalid", bad, len(files))
	}
}

// isDemandFile tells a demand file from a fleet spec by its top-level keys:
// a demand file has demand: and no regions:. An unreadable or unparsable
// file is left to the fleet loader, which reports it with its line.
func isDemandFile(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var top map[string]yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&top); err != nil {
		return false
	}
	_, demand := top["demand"]
	_, regions := top["regions"]
	return demand && !regions
}

// checkDemand parses a demand file and, with a fleet, builds the optimizer's
// problem from both (every frontend, class, priority and engine named must
// exist in the fleet).
func checkDemand(path string, spec *fleet.Spec) (string, error) {
	d, err := controlplane.LoadDemand(path)
	if err != nil {
		return "", err
	}
	sum := fmt.Sprintf("demand file: %d (frontend, class) entries, %d engine states", len(d.Demand), len(d.Engines))
	if spec == nil {
		return sum + "; names not checked (give --fleet)", nil
	}
	if _, err := controlplane.FromFleet(spec, d); err != nil {
		return "", fmt.Errorf("%s: against fleet %q: %w", path, spec.Name, err)
	}
	return sum + fmt.Sprintf(", consistent with fleet %q", spec.Name), nil
}
