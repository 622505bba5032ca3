package fleetsim

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var updateKeys = flag.Bool("update-keys", false, "rewrite testdata/keys-*.txt from this code's keys")

// TestUnsharedTrafficKeepsItsKeys holds the split table's promise that
// traffic without shared prefixes gets exactly the keys it got before the
// table learned shared prefixes (the shared-prefix depth, conversations as
// a sign of sharing): on azure-conv and overload, which share nothing, the
// inferlb policy's run (ext_proc's decisions with the control plane
// learning its table from their reports, 40 s of traffic) gives every
// request the same affinity key as testdata/keys-*.txt, recorded from a
// table that learned no shared-prefix depth (-update-keys rewrites them).
//
// Requests are matched by identity (conversation, arrival), not by
// position: admission is the control plane's business and changes with
// it, and a request admitted in one run and shed in the other has no key
// to compare. Equal keys mean equal placement; at least 90% of the
// recorded requests must be compared.
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
			var got []keyed
			if _, err := Run(context.Background(), Options{Scenario: sc, Policy: PolicyInferlb, NoSeries: true,
				Keys: func(conv int32, arrival time.Duration, k uint64) {
					got = append(got, keyed{requestID{conv, arrival}, k})
				}}); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "keys-"+name+".txt")
			if *updateKeys {
				var b strings.Builder
				for _, k := range got {
					fmt.Fprintf(&b, "%d %d %016x\n", k.id.conv, k.id.arrival.Microseconds(), k.key)
				}
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want := readKeys(t, path)
			byID := make(map[requestID]uint64, len(got))
			for _, k := range got {
				byID[requestID{k.id.conv, k.id.arrival.Truncate(time.Microsecond)}] = k.key
			}
			compared, diff := 0, 0
			for _, w := range want {
				k, ok := byID[w.id]
				if !ok {
					continue
				}
				compared++
				if k != w.key {
					if diff < 5 {
						t.Errorf("conversation %d, arrival %v: key %016x, want %016x", w.id.conv, w.id.arrival, k, w.key)
					}
					diff++
				}
			}
			t.Logf("%d keys, %d recorded; %d requests in both compared", len(got), len(want), compared)
			if diff > 0 {
				t.Errorf("%d of %d keys differ", diff, compared)
			}
			if len(want) < 1000 || float64(compared) < 0.9*float64(len(want)) {
				t.Errorf("only %d of %d recorded keys compared (the others' requests were not admitted)", compared, len(want))
			}
		})
	}
}

// requestID names a simulated request: its conversation and arrival.
type requestID struct {
	conv    int32
	arrival time.Duration
}

type keyed struct {
	id  requestID
	key uint64
}

// readKeys reads a keys file: one "conversation arrival_µs key_hex" line
// per admitted request.
func readKeys(t *testing.T, path string) []keyed {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []keyed
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var conv int32
		var us int64
		var k uint64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %x", &conv, &us, &k); err != nil {
			t.Fatalf("%s:%d: %v (want \"conversation arrival_µs key_hex\")", path, n, err)
		}
		out = append(out, keyed{requestID{conv, time.Duration(us) * time.Microsecond}, k})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
