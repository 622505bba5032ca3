package controlplane

import "github.com/inferlb/inferlb/controlplane/signals"

// The bounded load of a class's clusters.
//
// Envoy's consistent hashing with bounded loads (hash_balance_factor, the
// translation's 300 by default) sends a key to its own engine unless that
// engine already has factor × the mean of the cluster's requests in
// flight: the factor is what affinity may cost in balance. Affinity is
// worth a cache hit; a class whose traffic reuses nothing has no hit to
// keep, and the loosest bound only lets keys pile onto one engine while
// another idles. Such a class gets the tightest bound Envoy allows (100:
// no engine above the mean, the next in the table takes the request), so
// its requests are spread by load, as a least-request balancer would.
//
// "Reuses nothing" needs two pieces of evidence, since the cached share
// alone depends on the routing it would change: spread by load, a class
// that does reuse its prefixes caches little, which would keep it spread
// (a class with reuse, tightened while its caches are cold, stays cold for
// much longer and loses hits). So a class is tightened only when ext_proc's
// prefix sketch (the split table's view, affinity.go) holds at least
// minViewRequests requests of it and no chain point that two of them
// passed through (a point's request count's lower bound above 1: a
// shared system prompt, a conversation's later turn, a shared document
// would each show one), and the engines' counters show a cached share
// below noCacheShare. A repeated point, or a share above twice that,
// brings the configured factor back. Classes keyed by a session header
// report no chain points, so they keep the configured factor. Tightening
// shortens the tail of a class without reuse and lengthens that of a class
// whose cache hits it gives up, which is why it is decided per class (the
// simulator's figures are in docs/decisions/hash-balance-factor.md).
//
// An endpoint picker (docs/endpoint-picker.md) bounds load itself with
// the policy's load balancer, which keeps the configured factor.

// noCacheShare is the cached share below which a class reuses nothing.
const noCacheShare = 0.01

// tightFactor is Envoy's smallest hash_balance_factor.
const tightFactor = 100

// updateBounds decides, from this cycle's shapes and prefix views, which
// classes run at the tightest bound, and records each class's factor in
// its shape view.
func (c *Controller) updateBounds(prefixes map[string]signals.ClassPrefixes) {
	conf := c.cfg.Translate.HashBalanceFactor
	for _, cl := range c.problem.classes {
		s, ok := c.shapeView[cl.Name]
		if !ok {
			continue
		}
		view := prefixes[cl.Name]
		switch {
		case conf <= tightFactor || !s.CacheObserved || repeated(view) || s.CachedShare > 2*noCacheShare:
			delete(c.tight, cl.Name)
		case view.Requests >= minViewRequests && s.CachedShare < noCacheShare:
			c.tight[cl.Name] = true
		}
		s.HashBalanceFactor = c.hashBalanceFactor(cl.Name)
		c.shapeView[cl.Name] = s
	}
}

// repeated reports whether two of the view's requests passed through one
// chain point (its request count's lower bound above 1).
func repeated(view signals.ClassPrefixes) bool {
	for i := range view.Points {
		if view.Points[i].Requests > 1 {
			return true
		}
	}
	return false
}

// hashBalanceFactor is the bounded-load factor of a class's clusters: 0
// for the translation's own, tightFactor where the class reuses no cache.
func (c *Controller) hashBalanceFactor(class string) uint32 {
	if c.tight[class] {
		return tightFactor
	}
	return 0
}
