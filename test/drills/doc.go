// Package drills holds inferlb's fault drills: each one runs the whole stack
// on loopback — simulated engines (tools/enginesim), `inferlb
// control-plane` and `inferlb extproc` as child processes of the real binary,
// and a real Envoy with the envoy-configs bootstrap — injects one fault,
// counts every request a client sent (ok, failed, cut mid-stream, shed) and
// asserts what an operator relies on when that fault happens. The drills are
// tests (`go test ./test/drills/`); docs/operations.md lists the failure
// modes they cover and what each costs.
package drills
