// Package archtest checks the module's package graph (its tests; it has no
// code of its own): the graph written in docs/architecture.md is the one the
// code has, and the three paths keep their direction (the request path never
// imports the control loop, the optimizer knows nothing of the fleet schema
// or of Envoy).
package archtest
