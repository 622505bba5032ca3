// Package archtest holds the tests of the module's package graph (see
// graph_test.go); it has no code of its own.
package archtest
