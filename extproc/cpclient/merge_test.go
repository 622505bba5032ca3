package cpclient

import (
	"testing"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// A refused report's prefix counts merge into the next: counts and totals
// add, the continuation and conversation bitmaps are or-ed, so a point
// that two conversations shared across the two intervals still shows two.
func TestMergePrefixes(t *testing.T) {
	a := []*policyv1.PrefixReport{{Class: "c", Requests: 3, Tokens: 30, Counts: []*policyv1.PrefixCount{
		{Prefix: 7, DepthBytes: 8192, Requests: 2, Tokens: 20, Continuations: 1, Conversations: 1 << 5}}}}
	b := []*policyv1.PrefixReport{{Class: "c", Requests: 4, Tokens: 40, Counts: []*policyv1.PrefixCount{
		{Prefix: 7, DepthBytes: 8192, Requests: 1, RequestsError: 1, Tokens: 10, Continuations: 2, Conversations: 1 << 9},
		{Prefix: 8, DepthBytes: 512, Requests: 4, Tokens: 40, Conversations: 1}}}}
	m := mergePrefixes(a, b)
	if len(m) != 1 || m[0].Requests != 7 || m[0].Tokens != 70 || len(m[0].Counts) != 2 {
		t.Fatalf("merged %v", m)
	}
	p := m[0].Counts[0]
	if p.Prefix != 7 || p.Requests != 3 || p.RequestsError != 1 || p.Tokens != 30 || p.Continuations != 3 || p.Conversations != 1<<5|1<<9 {
		t.Fatalf("merged point %v", p)
	}
	if q := m[0].Counts[1]; q.Prefix != 8 || q.Conversations != 1 {
		t.Fatalf("second point %v", q)
	}
}
