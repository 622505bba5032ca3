package opcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/xds/auth"
)

// newExplainKeyCmd builds the explain-key command with its own flag set.
func newExplainKeyCmd() *cobra.Command {
	var (
		policyFile, controlPlane, nodeID, path, session, residency string
		asJSON                                                     bool
		timeout                                                    time.Duration
		cpAuth                                                     auth.Client
	)
	cmd := &cobra.Command{
		Use:   "explain-key [BODY_FILE]",
		Short: "Show which cache-affinity key a request body gets, and why",
		Long: `explain-key parses a request body (OpenAI chat/completions or completions
JSON; from BODY_FILE, or stdin without one or with "-") exactly as the ext_proc
service does, picks its class under a RoutingPolicy, and explains the value of
x-inferlb-affinity-key: the class's key order, which source keyed it, the
prompt's prefix chain (one point per message end and per 512·2^k bytes, with
the anchor, the end of the first user message) and the split table's rule for
each point, and the decision in words. See docs/extproc.md.

The policy comes from a file (--policy-file, protobuf JSON, as
'inferlb extproc --policy-file' reads it) or, as ext_proc gets it, from the
control plane over ADS (--control-plane with --node-id).

  inferlb explain-key --policy-file examples/policy-affinity.json examples/request-shared-preamble.json
  inferlb explain-key --control-plane 127.0.0.1:18000 --node-id frontend-us-east --insecure --session s-42 < examples/request-shared-preamble.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (policyFile == "") == (controlPlane == "") {
				return errors.New("give exactly one of --policy-file and --control-plane")
			}
			if controlPlane != "" && nodeID == "" {
				return errors.New("--control-plane needs --node-id (the frontend whose policy to read)")
			}
			var rp *policyv1.RoutingPolicy
			var err error
			if policyFile != "" {
				if rp, err = service.LoadPolicyFile(policyFile); err != nil {
					return err
				}
			} else if rp, err = fetchPolicy(cmd.Context(), controlPlane, nodeID, cpAuth, timeout); err != nil {
				return err
			}
			p, err := extproc.Compile(rp, nil)
			if err != nil {
				return err
			}
			in := cmd.InOrStdin()
			name := "stdin"
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in, name = f, args[0]
			}
			b, err := io.ReadAll(io.LimitReader(in, extproc.DefaultBodyLimit+1))
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if len(b) > extproc.DefaultBodyLimit {
				return fmt.Errorf("%s: larger than %d bytes", name, extproc.DefaultBodyLimit)
			}
			x, err := p.ExplainKey(path, session, residency, b)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(x)
			}
			printExplanation(cmd.OutOrStdout(), x, rp.GetVersion())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&policyFile, "policy-file", "", "RoutingPolicy in protobuf JSON")
	f.StringVar(&controlPlane, "control-plane", "", "read the node's policy from this control plane's ADS address")
	controlPlaneAuthFlags(f, &cpAuth)
	f.StringVar(&nodeID, "node-id", "", "the frontend node whose policy to read (with --control-plane)")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the control plane's policy (a control plane that just started publishes after its warm-up)")
	f.StringVar(&path, "path", "/v1/chat/completions", "the request's path: /v1/chat/completions or /v1/completions")
	f.StringVar(&session, "session", "", "the request's x-session-id header")
	f.StringVar(&residency, "residency", "", "the request's x-data-residency header")
	f.BoolVar(&asJSON, "json", false, "print the explanation as JSON")
	return cmd
}

// fetchPolicy subscribes to a node's RoutingPolicy over ADS and returns the
// first one received.
func fetchPolicy(ctx context.Context, addr, node string, creds auth.Client, timeout time.Duration) (*policyv1.RoutingPolicy, error) {
	dial, err := creds.DialOptions()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("--control-plane %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	got := make(chan *policyv1.RoutingPolicy, 1)
	sub := &cpclient.Subscriber{Conn: conn, NodeID: node, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Apply: func(p *policyv1.RoutingPolicy) error {
		select {
		case got <- p:
		default:
		}
		cancel()
		return nil
	}}
	_ = sub.Run(ctx)
	select {
	case p := <-got:
		return p, nil
	default:
		return nil, fmt.Errorf("--control-plane %s: no policy for node %q within %v", addr, node, timeout)
	}
}

func printExplanation(w io.Writer, x *extproc.KeyExplanation, version string) {
	off := ""
	if x.Off {
		off = ", affinity off"
	}
	table := "no split table"
	if x.TableRules > 0 || x.SharedDepthBytes > 0 {
		table = fmt.Sprintf("split table %s with %d rules", x.TableVersion, x.TableRules)
	}
	if x.SharedDepthBytes > 0 {
		table += fmt.Sprintf(", shared-prefix depth %d bytes", x.SharedDepthBytes)
	}
	fmt.Fprintf(w, "policy %s, class %s: key order %s%s; %s\n", version, x.Class, strings.Join(x.Sources, ", "), off, table)
	if len(x.Points) > 0 {
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "point\tbytes\ttokens\tkind\thash\trule\t")
		for i, p := range x.Points {
			kind := "inside a message"
			switch {
			case p.Anchor:
				kind = "anchor (end of the first user message)"
			case p.MessageEnd:
				kind = "message end"
			}
			if p.AfterAnchor {
				kind += ", past the anchor"
			}
			mark := ""
			switch {
			case i == x.Point && x.Kind == "spread":
				mark = " ← the conversation"
			case i == x.Point:
				mark = " ← key"
			case i == x.Hot && x.Kind == "spread":
				mark = " ← key (with the conversation's slot)"
			case i == x.Hot:
				mark = " ← deepest hot"
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s%s\t\n", i, p.DepthBytes, p.DepthTokens, kind, p.Hash, p.Rule, mark)
		}
		_ = tw.Flush()
	}
	header := x.Header
	if header == "" {
		header = "(fresh per request)"
	}
	fmt.Fprintf(w, "x-inferlb-affinity-key: %s\nwhy: %s\n", header, x.Why)
}
