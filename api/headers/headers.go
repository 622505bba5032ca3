// Package headers names the HTTP headers inferlb's components agree on.
//
// Two kinds: client-facing headers a caller may set (session id, priority,
// residency), and internal headers (prefix "x-inferlb-") that only inferlb
// sets. The ext_proc service removes every client-supplied internal header
// before it decides anything, so a client cannot forge a class, a key or a
// priority; Envoy's route then reads only values ext_proc wrote.
package headers

const (
	// InternalPrefix starts every header only inferlb may set.
	InternalPrefix = "x-inferlb-"

	// Client-facing.

	// SessionID is an explicit conversation id from the client; the
	// strongest cache-affinity signal.
	SessionID = "x-session-id"
	// Priority names the request's traffic priority (fleet spec priorities).
	Priority = "x-priority"
	// Residency demands a data-residency zone ("eu"): only engines in
	// regions of that zone may serve the request.
	Residency = "x-data-residency"

	// Internal, written by ext_proc, read by Envoy's route or the engines.

	// Cluster is the Envoy cluster of the request's eligibility class; the
	// route's cluster_header.
	Cluster = "x-inferlb-cluster"
	// AffinityKey is what the route's hash_policy hashes: Maglev/ring hash
	// then sends every turn of a conversation to the same engine.
	AffinityKey = "x-inferlb-affinity-key"
	// Class is the eligibility class name (for logs and engines).
	Class = "x-inferlb-class"
	// PriorityLevel is the resolved priority level.
	PriorityLevel = "x-inferlb-priority-level"
	// SourceRegion is the frontend's region. The engine simulator delays its
	// answer by the fleet's round trip from this region (no netem here).
	SourceRegion = "x-inferlb-source-region"
	// RequestID is the id ext_proc gives an admitted request; Envoy's
	// request access log carries it back when the request ends.
	RequestID = "x-inferlb-request-id"

	// EnvoyMaxRetries is Envoy's own per-request retry override; ext_proc
	// sets it from the retry allowance.
	EnvoyMaxRetries = "x-envoy-max-retries"
)
