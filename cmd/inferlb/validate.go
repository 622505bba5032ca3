package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/api/fleet"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "validate FILE...",
		Short: "Check fleet specs and summarize them",
		Long: `validate parses each fleet spec FILE (YAML, see docs/fleet-spec.md) with the
same defaults and rules every inferlb component uses.

A valid file prints one line: the file and a summary of the fleet (regions,
frontends, engines by GPU type, classes, models, priorities). An invalid file
prints every problem on its own line, as FILE:LINE: PATH: PROBLEM, e.g.

  fleet.yaml:42: engines[3].region: unknown region "eu-wst"

and the command exits with status 1. A model's tokenizer (models[].tokenizer)
is parsed with the loader ext_proc uses, so a tokenizer.json it cannot use is
reported here.`,
		Example: "  inferlb validate examples/fleet-3region.yaml\n  inferlb validate examples/*.yaml",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runValidate(cmd.OutOrStdout(), cmd.ErrOrStderr(), args)
		},
	})
}

// runValidate checks each file: summaries go to out, problems to errOut.
// It returns an error if any file is invalid.
func runValidate(out, errOut io.Writer, files []string) error {
	bad := 0
	for _, file := range files {
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
		return errors.New("invalid fleet spec")
	default:
		return fmt.Errorf("%d of %d fleet specs invalid", bad, len(files))
	}
}
