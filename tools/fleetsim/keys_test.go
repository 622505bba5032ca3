package fleetsim

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var updateKeys = flag.Bool("update-keys", false, "rewrite testdata/keys-*.txt from this code's keys")

// TestUnsharedTrafficKeepsItsKeys holds the split table's promise that
// traffic without shared prefixes gets exactly the keys it got before the
// table learned shared prefixes (the shared-prefix depth, conversations as
// a sign of sharing; issue 23): on azure-conv and overload, which share
// nothing, the inferlb policy's run (ext_proc's decisions with the control
// plane learning its table from their reports, 40 s of traffic) gives
// every request the same affinity key, in order, as testdata/keys-*.txt,
// which main's code wrote before the change (-update-keys rewrites them).
// Rewritten once after the geo work (issue 22) changed admission: overload's
// file only gained the 159 requests no longer shed, every earlier key in its
// place (a diff of pure insertions), so the keys themselves did not move.
// Equal keys in order mean equal placement: the figures cannot move.
func TestUnsharedTrafficKeepsItsKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: two 40 s simulations")
	}
	for _, name := range []string{"azure-conv", "overload"} {
		t.Run(name, func(t *testing.T) {
			sc, err := LoadScenario(filepath.Join("..", "..", "examples", "sim", name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			sc.Duration, sc.Warmup = 40*time.Second, 5*time.Second
			var got []uint64
			if _, err := Run(context.Background(), Options{Scenario: sc, Policy: PolicyInferlb, NoSeries: true,
				Keys: func(k uint64) { got = append(got, k) }}); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "keys-"+name+".txt")
			if *updateKeys {
				var b strings.Builder
				for _, k := range got {
					fmt.Fprintf(&b, "%016x\n", k)
				}
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want := readKeys(t, path)
			if len(got) != len(want) {
				t.Errorf("%d keys, want %d", len(got), len(want))
			}
			diff := 0
			for i := range min(len(got), len(want)) {
				if got[i] != want[i] {
					if diff < 5 {
						t.Errorf("request %d: key %016x, want %016x", i, got[i], want[i])
					}
					diff++
				}
			}
			if diff > 0 {
				t.Errorf("%d of %d keys differ", diff, len(want))
			}
			if len(want) < 1000 {
				t.Errorf("only %d keys compared", len(want))
			}
		})
	}
}

func readKeys(t *testing.T, path string) []uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, err := strconv.ParseUint(sc.Text(), 16, 64)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, k)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
