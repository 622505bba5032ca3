package extproc

import (
	"fmt"
	"hash/fnv"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/hashmix"
)

// Cache affinity: the key the route hashes (docs/extproc.md).
//
// A class tries its key sources in order (the fleet spec's
// affinity.keys, by default the session header, prompt_cache_key, user,
// then the prompt's prefix); the first one the request has gives the key.
//
// The prefix source walks the request's prefix chain (body.Chain) through
// the class's split table, from the shallowest point:
//
//   - a GROUP point (a shared prefix whose load one engine can serve) is
//     the key: conversations sharing it land together;
//   - a DEEPER or SPREAD point is hot (more load than one engine's share)
//     and never the key; the walk goes on, remembering the deepest;
//   - with a shared-prefix depth in the table (the control plane saw
//     different conversations share prefixes inside their first message),
//     the first other point before the anchor at least that deep is the
//     key, as a GROUP: requests sharing the prefix up to it land together
//     from their first request, before any rule names the prefix;
//   - any other point at or past the anchor (the end of the first user
//     message) is the conversation's point, and the key: points before the
//     anchor are skipped, so without a table every conversation is keyed
//     on its own first turn, which every later turn repeats.
//
// If the deepest hot point says SPREAD, the key is that prefix and the
// conversation's slot among its spread R (jump consistent hashing, a
// "conversation mod R" that moves few conversations when R changes): the
// prefix's traffic is cut into R keys, each conversation keeping one. If every point from the anchor on is hot
// (identical prompts), the key is the deepest hot point and a fresh number
// modulo R. The table is the control plane's, identical at every replica,
// so replicas agree on every key.
//
// Without shared prefixes the table has no GROUP rule and no shared-prefix
// depth (both need two conversations through one point before their
// anchors), so every key is the conversation's, as without a table.

// keySource is a key source of a class.
type keySource uint8

const (
	srcSession keySource = iota + 1
	srcPromptCacheKey
	srcUser
	srcPrefix
)

var sourceNames = [...]string{srcSession: "session", srcPromptCacheKey: "prompt_cache_key", srcUser: "user", srcPrefix: "prefix"}

func (s keySource) String() string {
	if int(s) < len(sourceNames) && sourceNames[s] != "" {
		return sourceNames[s]
	}
	return fmt.Sprintf("keySource(%d)", uint8(s))
}

// defaultSources is the order of a class whose policy names none.
var defaultSources = []keySource{srcSession, srcPromptCacheKey, srcUser, srcPrefix}

// prefixRule is a compiled split-table rule.
type prefixRule struct {
	action policyv1.PrefixRule_Action
	spread uint32
}

// affinity is a class's compiled affinity configuration; immutable.
type affinity struct {
	sources []keySource
	off     bool
	// table maps chain point hashes to rules; nil when empty.
	table   map[uint64]prefixRule
	version string
	// sharedDepth is the table's shared-prefix depth in bytes (0: none).
	sharedDepth uint32
}

// maxSpread bounds a rule's spread; maxRules a table's size.
const (
	maxSpread = 1024
	maxRules  = 1 << 16
)

func compileAffinity(a *policyv1.Affinity) (affinity, error) {
	out := affinity{off: a.GetOff(), version: a.GetTable().GetVersion(), sharedDepth: a.GetTable().GetSharedDepthBytes()}
	seen := map[keySource]bool{}
	for i, k := range a.GetKeys() {
		s := keySource(0)
		switch k {
		case policyv1.KeySource_KEY_SOURCE_SESSION:
			s = srcSession
		case policyv1.KeySource_KEY_SOURCE_PROMPT_CACHE_KEY:
			s = srcPromptCacheKey
		case policyv1.KeySource_KEY_SOURCE_USER:
			s = srcUser
		case policyv1.KeySource_KEY_SOURCE_PREFIX:
			s = srcPrefix
		default:
			return out, fmt.Errorf("affinity.keys[%d]: unknown key source %v", i, k)
		}
		if seen[s] {
			return out, fmt.Errorf("affinity.keys[%d]: %s listed twice", i, s)
		}
		seen[s] = true
		out.sources = append(out.sources, s)
	}
	if len(out.sources) == 0 {
		out.sources = defaultSources
	}
	rules := a.GetTable().GetRules()
	if len(rules) > maxRules {
		return out, fmt.Errorf("affinity.table: %d rules, at most %d", len(rules), maxRules)
	}
	if len(rules) > 0 {
		out.table = make(map[uint64]prefixRule, len(rules))
	}
	for i, r := range rules {
		switch r.GetAction() {
		case policyv1.PrefixRule_ACTION_DEEPER, policyv1.PrefixRule_ACTION_GROUP:
		case policyv1.PrefixRule_ACTION_SPREAD:
			if r.GetSpread() < 1 {
				return out, fmt.Errorf("affinity.table.rules[%d] (%016x): spread %d, a SPREAD rule needs at least 1", i, r.GetPrefix(), r.GetSpread())
			}
		default:
			return out, fmt.Errorf("affinity.table.rules[%d] (%016x): unknown action %v", i, r.GetPrefix(), r.GetAction())
		}
		if r.GetSpread() > maxSpread {
			return out, fmt.Errorf("affinity.table.rules[%d] (%016x): spread %d above %d", i, r.GetPrefix(), r.GetSpread(), maxSpread)
		}
		if _, dup := out.table[r.GetPrefix()]; dup {
			return out, fmt.Errorf("affinity.table.rules[%d]: prefix %016x listed twice", i, r.GetPrefix())
		}
		out.table[r.GetPrefix()] = prefixRule{action: r.GetAction(), spread: r.GetSpread()}
	}
	return out, nil
}

// KeyDecision is how a request's affinity key came about.
type KeyDecision struct {
	// Key is the route's hash key (the header carries it in hex); 0 when
	// the request had nothing to key on (the caller draws a fresh key).
	Key uint64
	// Conversation is the conversation's key, which shedding uses: Key,
	// except for spread prefixes (the conversation's own point) and with
	// affinity off (the key the request would have had).
	Conversation uint64
	// Source is the key source used ("" if none), Kind what the prefix
	// walk decided: "conversation", "group", "spread" ("" for the other
	// sources).
	Source, Kind string
	// Off: affinity is off for the class; Key is then fresh per request.
	Off bool
	// Shared: the group point is the table's shared-prefix depth's (no
	// GROUP rule names it).
	Shared bool
	// Point is the chain point keyed on (-1 if none); Hot the deepest hot
	// point of the walk (-1 if none); Spread its R when Kind is "spread".
	Point, Hot int
	Spread     uint32
	// Walked is the number of chain points the walk visited (they are the
	// ones reported to the control plane's sketch).
	Walked int
}

// Key tags keep keys from different sources apart (a session id never
// collides with an equal user name, a group key with a conversation's).
const (
	tagPrefix = 0x68
	tagGroup  = 0x67
	tagSpread = 0x73
)

// key derives the affinity key of a request with session header session
// (may be "") and parsed body br. fresh draws a fresh random key, used
// when a spread prefix cannot tell conversations apart; it may be nil
// (then 0 stands in).
func (a *affinity) key(session string, br *body.Request, fresh func() uint64) KeyDecision {
	d := KeyDecision{Point: -1, Hot: -1, Off: a.off}
	for _, s := range a.sources {
		switch s {
		case srcSession:
			if session != "" {
				d.Key, d.Source = keyHash('s', session), "session"
			}
		case srcPromptCacheKey:
			if br.PromptCacheKey != "" {
				d.Key, d.Source = keyHash('p', br.PromptCacheKey), "prompt_cache_key"
			}
		case srcUser:
			if br.User != "" {
				d.Key, d.Source = keyHash('u', br.User), "user"
			}
		case srcPrefix:
			if br.HasPrefix {
				a.prefixKey(&d, &br.Chain, fresh)
			}
		}
		if d.Source != "" {
			break
		}
	}
	d.Conversation = d.Key
	if d.Kind == "spread" && d.Point >= 0 {
		d.Conversation = mix(br.Chain.Points[d.Point].Hash ^ tagPrefix)
	}
	if a.off {
		d.Key = 0 // the caller draws a fresh one
	}
	return d
}

// prefixKey walks the chain through the table (see the top of the file).
func (a *affinity) prefixKey(d *KeyDecision, c *body.Chain, fresh func() uint64) {
	d.Source = "prefix"
	pts := c.At()
	var hot prefixRule
	group := false
	d.Walked = len(pts)
walk:
	for i := range pts {
		if r, ok := a.table[pts[i].Hash]; ok {
			if r.action == policyv1.PrefixRule_ACTION_GROUP {
				d.Point, group = i, true
				d.Walked = i + 1
				break walk
			}
			d.Hot, hot = i, r
			continue
		}
		if a.sharedDepth > 0 && i < c.Anchor && pts[i].Depth >= a.sharedDepth {
			d.Point, group, d.Shared = i, true, true
			d.Walked = i + 1
			break
		}
		if i >= c.Anchor {
			d.Point = i
			d.Walked = i + 1
			break
		}
	}
	switch {
	case group:
		d.Kind, d.Key = "group", mix(pts[d.Point].Hash^tagGroup)
	case d.Hot >= 0 && (hot.action == policyv1.PrefixRule_ACTION_SPREAD || d.Point < 0):
		r := uint64(max(hot.spread, 1))
		var conv uint64
		if d.Point >= 0 {
			conv = mix(pts[d.Point].Hash ^ tagSpread)
		} else if fresh != nil {
			conv = fresh()
		}
		d.Kind, d.Spread = "spread", uint32(r)
		d.Key = mix(pts[d.Hot].Hash ^ tagSpread ^ uint64(jump(conv, int64(r))+1)<<8)
	default:
		d.Kind, d.Key = "conversation", mix(pts[d.Point].Hash^tagPrefix)
	}
}

// jump is Lamping and Veach's jump consistent hash: key's slot among n,
// such that going from n to n+1 slots moves only 1/(n+1) of the keys (a
// spread prefix's R changes without remapping most of its conversations,
// as "conversation mod R" would).
func jump(key uint64, n int64) int64 {
	b, j := int64(-1), int64(0)
	for j < n {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return b
}

// label is the decision's value of the keys metric's "key" label.
func (d *KeyDecision) label() string {
	switch {
	case d.Off:
		return "off"
	case d.Source == "":
		return "none"
	case d.Source == "prefix":
		return d.Kind
	}
	return d.Source
}

func keyHash(tag byte, v string) uint64 {
	h := fnv.New64a()
	h.Write([]byte{tag, 0})
	h.Write([]byte(v))
	return mix(h.Sum64())
}

// mix is MurmurHash3's 64-bit finalizer (fmix64), so keys spread over the
// whole range; 0 is kept free (it means "no key").
func mix(h uint64) uint64 {
	h = hashmix.Murmur3(h)
	if h == 0 {
		h = 1
	}
	return h
}

// TableRules returns the size and version of the class's split table.
func (c *Class) TableRules() (rules int, version string) { return len(c.aff.table), c.aff.version }

// SharedDepthBytes returns the class's shared-prefix depth (0: none).
func (c *Class) SharedDepthBytes() uint32 { return c.aff.sharedDepth }
