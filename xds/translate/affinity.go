package translate

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Affinity is a class's cache-affinity configuration as published in its
// RoutingPolicy: the key sources in order (the fleet spec's names), the
// off switch, and the split table.
type Affinity struct {
	Keys  []string
	Off   bool
	Rules []PrefixRule
	// SharedDepthBytes is the table's shared-prefix depth (0: none; see
	// policyv1.PrefixTable.shared_depth_bytes).
	SharedDepthBytes uint32
}

// PrefixAction is what a split-table rule does with its prefix.
type PrefixAction int

const (
	// Deeper: the prefix is hot; key on the conversation.
	Deeper PrefixAction = iota + 1
	// Spread: the prefix is hot; key on it and the conversation modulo
	// Spread.
	Spread
	// Group: the prefix is shared and cold; key on it.
	Group
)

func (a PrefixAction) String() string {
	switch a {
	case Deeper:
		return "deeper"
	case Spread:
		return "spread"
	case Group:
		return "group"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// PrefixRule is one split-table rule: a chain point's hash, its action, and
// the number of keys a hot prefix is cut into.
type PrefixRule struct {
	Prefix uint64
	Action PrefixAction
	Spread uint32
}

var keySources = map[string]policyv1.KeySource{
	"session":          policyv1.KeySource_KEY_SOURCE_SESSION,
	"prompt_cache_key": policyv1.KeySource_KEY_SOURCE_PROMPT_CACHE_KEY,
	"user":             policyv1.KeySource_KEY_SOURCE_USER,
	"prefix":           policyv1.KeySource_KEY_SOURCE_PREFIX,
}

// maxSpread is ext_proc's bound on a rule's spread.
const maxSpread = 1024

func (a Affinity) check() error {
	seen := map[string]bool{}
	for i, k := range a.Keys {
		if _, ok := keySources[k]; !ok {
			return fmt.Errorf("keys[%d]: unknown key source %q", i, k)
		}
		if seen[k] {
			return fmt.Errorf("keys[%d]: %q twice", i, k)
		}
		seen[k] = true
	}
	prefixes := map[uint64]bool{}
	for i, r := range a.Rules {
		switch {
		case r.Action < Deeper || r.Action > Group:
			return fmt.Errorf("rules[%d] (%016x): %v", i, r.Prefix, r.Action)
		case r.Action == Spread && r.Spread < 1:
			return fmt.Errorf("rules[%d] (%016x): a spread rule needs spread ≥ 1", i, r.Prefix)
		case r.Spread > maxSpread:
			return fmt.Errorf("rules[%d] (%016x): spread %d above %d", i, r.Prefix, r.Spread, maxSpread)
		case prefixes[r.Prefix]:
			return fmt.Errorf("rules[%d]: prefix %016x twice", i, r.Prefix)
		}
		prefixes[r.Prefix] = true
	}
	return nil
}

// policy is the RoutingPolicy form, nil for the zero value. Rules are
// sorted by prefix and the table's version is a hash of them, so equal
// tables have equal versions wherever they are translated.
func (a Affinity) policy() *policyv1.Affinity {
	if len(a.Keys) == 0 && !a.Off && len(a.Rules) == 0 && a.SharedDepthBytes == 0 {
		return nil
	}
	out := &policyv1.Affinity{Off: a.Off}
	for _, k := range a.Keys {
		out.Keys = append(out.Keys, keySources[k])
	}
	if len(a.Rules) == 0 && a.SharedDepthBytes == 0 {
		return out
	}
	rules := slices.Clone(a.Rules)
	slices.SortFunc(rules, func(x, y PrefixRule) int { return cmp.Compare(x.Prefix, y.Prefix) })
	h := sha256.New()
	t := &policyv1.PrefixTable{SharedDepthBytes: a.SharedDepthBytes}
	if a.SharedDepthBytes > 0 {
		// Hashed first, so a table without it keeps its version.
		var b [5]byte
		b[0] = 'd'
		binary.LittleEndian.PutUint32(b[1:], a.SharedDepthBytes)
		h.Write(b[:])
	}
	for _, r := range rules {
		var b [13]byte
		binary.LittleEndian.PutUint64(b[:], r.Prefix)
		b[8] = byte(r.Action)
		binary.LittleEndian.PutUint32(b[9:], r.Spread)
		h.Write(b[:])
		t.Rules = append(t.Rules, &policyv1.PrefixRule{Prefix: r.Prefix, Action: policyv1.PrefixRule_Action(r.Action), Spread: r.Spread})
	}
	t.Version = hex.EncodeToString(h.Sum(nil)[:8])
	out.Table = t
	return out
}
