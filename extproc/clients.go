package extproc

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/inferlb/inferlb/api/headers"
)

// ClientPriorities says which priorities each client may use. The client is
// named by a request header that an authentication layer in front of
// ext_proc sets from a verified credential (Envoy's JWT filter with
// claim_to_headers, an ext_authz service, a mesh's identity), never by the
// client itself: the bootstrap removes the header from client requests
// before any filter runs. Without it, x-priority is the client's word.
//
//	header: x-client-id
//	clients:
//	  tenant-a: [interactive, standard, batch]
//	  tenant-b: [batch]
//	default: [standard, batch]   # clients not listed, and requests without the header
//
// A request asking for a priority its client may not use is refused (403
// priority_not_allowed, naming the allowed ones). A request asking for none
// gets the policy's default priority if allowed, else the least important
// priority its client may use.
type ClientPriorities struct {
	Header  string              `yaml:"header"`
	Clients map[string][]string `yaml:"clients"`
	Default []string            `yaml:"default"`
}

// LoadClientPriorities reads a ClientPriorities file (YAML; unknown keys
// are errors).
func LoadClientPriorities(path string) (*ClientPriorities, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var c ClientPriorities
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("client priorities %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("client priorities %s: %w", path, err)
	}
	return &c, nil
}

// Validate checks the header name and the lists.
func (c *ClientPriorities) Validate() error {
	var errs []error
	h := c.Header
	switch {
	case h == "":
		errs = append(errs, errors.New("header: required (the header the authentication layer sets)"))
	case h != strings.ToLower(h) || strings.ContainsAny(h, " :\t") || strings.HasPrefix(h, ":"):
		errs = append(errs, fmt.Errorf("header: %q must be a lower-case header name", h))
	case h == headers.Priority || h == headers.SessionID || h == headers.Residency || strings.HasPrefix(h, "x-envoy-"):
		errs = append(errs, fmt.Errorf("header: %q is a header clients set or Envoy reads; name the one your authentication layer sets", h))
	}
	check := func(where string, ps []string) {
		if len(ps) == 0 {
			errs = append(errs, fmt.Errorf("%s: no priority (list at least one; a client that may use none should be refused by the authentication layer)", where))
		}
		for i, p := range ps {
			if p == "" {
				errs = append(errs, fmt.Errorf("%s[%d]: empty priority name", where, i))
			}
		}
	}
	if c.Default != nil || len(c.Clients) == 0 {
		check("default", c.Default)
	}
	for _, id := range slices.Sorted(maps.Keys(c.Clients)) {
		check("clients."+id, c.Clients[id])
	}
	return errors.Join(errs...)
}

// allowed returns the priorities the client may use.
func (c *ClientPriorities) allowed(client string) []string {
	if ps, ok := c.Clients[client]; ok && client != "" {
		return ps
	}
	return c.Default
}

// Names are every priority the file names, sorted.
func (c *ClientPriorities) Names() []string {
	set := map[string]bool{}
	for _, p := range c.Default {
		set[p] = true
	}
	for _, ps := range c.Clients {
		for _, p := range ps {
			set[p] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// priorityFor applies the client's allowance to the priority a request
// asked for ("" = none): it returns the level and name to use, or the
// refusal.
func (c *ClientPriorities) priorityFor(p *Policy, client, asked string, level uint32, name string) (uint32, string, *apiError) {
	allowed := c.allowed(client)
	if slices.Contains(allowed, name) {
		return level, name, nil
	}
	who := fmt.Sprintf("client %q", client)
	if client == "" {
		who = "a request without " + c.Header
	}
	if asked != "" {
		return 0, "", &apiError{status: 403, typ: "permission_error", code: "priority_not_allowed", param: headers.Priority,
			message: fmt.Sprintf("Priority %q is not allowed for %s; allowed: %s.", asked, who, strings.Join(allowed, ", ")), reason: "priority_not_allowed"}
	}
	// No priority asked: the least important one the client may use.
	best, bestName, found := uint32(0), "", false
	for _, n := range allowed {
		if l, ok := p.priorities[n]; ok && (!found || l > best) {
			best, bestName, found = l, n, true
		}
	}
	if !found {
		return 0, "", &apiError{status: 403, typ: "permission_error", code: "priority_not_allowed", param: headers.Priority,
			message: fmt.Sprintf("None of the priorities allowed for %s (%s) is one of this policy's (%s).", who, strings.Join(allowed, ", "), strings.Join(p.priorityNames(), ", ")), reason: "priority_not_allowed"}
	}
	return best, bestName, nil
}
