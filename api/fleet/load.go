package fleet

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// MaxSpecBytes is the largest spec Parse and Load accept (8 MiB: room for
// tens of thousands of engines).
const MaxSpecBytes = 8 << 20

// Load reads and parses the fleet spec at path. Errors name the file; the
// FieldErrors inside are available through Errors.
func Load(path string) (*Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSpecBytes+1))
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	s, lines, err := parse(data)
	if err == nil {
		err = s.resolveTokenizers(filepath.Dir(path), lines)
	}
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", path, err)
	}
	return s, nil
}

// Check is Load plus a full parse of every model's tokenizer.json with the
// loader ext_proc uses, so that a file it would refuse (an unsupported
// tokenizer component, say) is reported with its spec path and line. It
// reads each tokenizer whole (about a second for a 150k-token vocabulary):
// inferlb validate uses it; the running components use Load.
func Check(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	s, err := Load(path)
	if err != nil {
		return nil, err
	}
	_, lines, _ := parse(data)
	var errs []*FieldError
	for i, m := range s.Models {
		if m.Tokenizer == "" {
			continue
		}
		if _, err := hf.Load(m.Tokenizer); err != nil {
			p := fmt.Sprintf("models[%d].tokenizer", i)
			errs = append(errs, &FieldError{Path: p, Line: lineOf(lines, p), Msg: err.Error()})
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("fleet %s: %w", path, join(errs))
	}
	return s, nil
}

// resolveTokenizers makes each model's tokenizer path relative to dir (the
// spec's directory) and computes its digest; a file that cannot be read is a
// FieldError on models[i].tokenizer. The file's content is checked by the
// programs that parse it (inferlb validate, ext_proc).
func (s *Spec) resolveTokenizers(dir string, lines map[string]int) error {
	var errs []*FieldError
	for i := range s.Models {
		m := &s.Models[i]
		if m.Tokenizer == "" {
			continue
		}
		if !filepath.IsAbs(m.Tokenizer) {
			m.Tokenizer = filepath.Join(dir, m.Tokenizer)
		}
		sum, err := hf.Digest(m.Tokenizer)
		if err != nil {
			p := fmt.Sprintf("models[%d].tokenizer", i)
			errs = append(errs, &FieldError{Path: p, Line: lineOf(lines, p), Msg: err.Error()})
			continue
		}
		m.TokenizerSHA256 = sum
	}
	if len(errs) > 0 {
		return join(errs)
	}
	return nil
}

// Parse decodes, defaults, validates and normalizes a YAML fleet spec.
//
//   - decode: YAML into the document types; unknown keys and values of the
//     wrong kind are errors.
//   - defaults: fill optional fields that were omitted (never a value that
//     was given, even a wrong one).
//   - validate: check every rule, collecting all problems.
//   - normalize: effective values, derived fields and lookup indexes.
//
// On failure the error joins one *FieldError per problem (errors.Join; see
// Errors), each naming the field path and the bad value, e.g.
// `engines[3].region: unknown region "eu-wst"`. The returned Spec is
// read-only and safe to share between goroutines.
func Parse(data []byte) (*Spec, error) {
	s, _, err := parse(data)
	return s, err
}

// parse is Parse, also returning the line of every field path.
func parse(data []byte) (*Spec, map[string]int, error) {
	if len(data) > MaxSpecBytes {
		return nil, nil, join([]*FieldError{{Msg: fmt.Sprintf("spec larger than %d bytes", MaxSpecBytes)}})
	}
	d, lines, errs := decode(data)
	if d == nil {
		if len(errs) == 0 { // decode always explains; be safe regardless
			errs = []*FieldError{{Msg: "invalid spec"}}
		}
		return nil, lines, join(errs)
	}
	setDefaults(d)
	decodeErrs := errs
	for _, e := range validate(d) {
		// A field the decode step rejected is reported once, by it.
		if slices.ContainsFunc(decodeErrs, func(de *FieldError) bool { return covers(de.Path, e.Path) }) {
			continue
		}
		if e.Line == 0 {
			e.Line = lineOf(lines, e.Path)
		}
		errs = append(errs, e)
	}
	if len(errs) > 0 {
		// Input order; problems of the whole (line 0) last.
		slices.SortStableFunc(errs, func(a, b *FieldError) int {
			return cmp.Compare(uint(a.Line-1), uint(b.Line-1))
		})
		return nil, lines, join(errs)
	}
	return normalize(d), lines, nil
}

// covers reports whether a problem at path p makes one at q redundant: q is p
// or inside it.
func covers(p, q string) bool {
	return p == q || p == "" || strings.HasPrefix(q, p) && (q[len(p)] == '.' || q[len(p)] == '[')
}

// New defaults, validates and normalizes a Spec built in Go (for instance a
// generated fleet in a simulation), as Parse does for YAML. In s, a zero
// value of an optional field means "omitted" and gets the default; required
// fields are checked as given. s is not modified.
func New(s Spec) (*Spec, error) {
	d := toDoc(&s)
	setDefaults(d)
	if errs := validate(d); len(errs) > 0 {
		return nil, join(errs)
	}
	return normalize(d), nil
}

func join(errs []*FieldError) error {
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

// nz returns nil for a zero value: the field counts as omitted.
func nz[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func toDoc(s *Spec) *specDoc {
	d := &specDoc{
		Name:      s.Name,
		Regions:   s.Regions,
		Frontends: append([]Frontend(nil), s.Frontends...),
	}
	if s.Network.SameRegionRTTMs != nil {
		d.Network.SameRegionRTTMs = ptr(*s.Network.SameRegionRTTMs)
	}
	for _, l := range s.Network.Links {
		d.Network.Links = append(d.Network.Links, linkDoc{A: l.A, B: l.B, RTTMs: ptr(l.RTTMs)})
	}
	for _, m := range s.Models {
		// ChatTemplateTokens: 0 in Go means omitted (the default); an
		// explicit 0 needs YAML.
		d.Models = append(d.Models, modelDoc{Name: m.Name, MaxContextTokens: ptr(m.MaxContextTokens),
			Tokenizer: m.Tokenizer, TokenizerSHA256: m.TokenizerSHA256, ChatTemplateTokens: nz(m.ChatTemplateTokens)})
	}
	for _, p := range s.Profiles {
		d.Profiles = append(d.Profiles, profileDoc{
			GPU:                p.GPU,
			Model:              p.Model,
			PrefillTokensPerS:  ptr(p.PrefillTokensPerS),
			OverheadMs:         nz(p.OverheadMs),
			DecodeStepMs:       ptr(p.DecodeStepMs),
			DecodeStepPerSeqMs: ptr(p.DecodeStepPerSeqMs),
			MaxRunning:         nz(p.MaxRunning),
			MaxBatchedTokens:   nz(p.MaxBatchedTokens),
			KVCapacityTokens:   ptr(p.KVCapacityTokens),
			BlockSize:          nz(p.BlockSize),
			MaxContextTokens:   nz(p.MaxContextTokens),
			CapacityRPS:        nz(p.CapacityRPS),
			TTFTCurve:          curveDocOf(p.TTFTCurve),
			TBOTCurve:          curveDocOf(p.TBOTCurve),
		})
	}
	if s.Classes != nil {
		cs := []classDoc{}
		for _, c := range s.Classes {
			cs = append(cs, classDoc{
				Name:             c.Name,
				Model:            c.Model,
				Residency:        c.Residency,
				MinContextTokens: nz(c.MinContextTokens),
				MeanPromptTokens: nz(c.MeanPromptTokens),
				MeanOutputTokens: nz(c.MeanOutputTokens),
				Affinity:         affinityDocOf(c.Affinity),
			})
		}
		d.Classes = &cs
	}
	if s.Priorities != nil {
		ps := []priorityDoc{}
		for _, p := range s.Priorities {
			ps = append(ps, priorityDoc{Name: p.Name, Level: ptr(p.Level), ShedCost: ptr(p.ShedCost)})
		}
		d.Priorities = &ps
	}
	for _, e := range s.Engines {
		d.Engines = append(d.Engines, engineDoc{
			ID:         e.ID,
			Address:    e.Address,
			Region:     e.Region,
			GPU:        e.GPU,
			Model:      e.Model,
			Replicas:   nz(e.Replicas),
			Labels:     e.Labels,
			Server:     e.Server,
			HealthPath: e.HealthPath,
		})
	}
	return d
}

// affinityDocOf treats zero fields as omitted (a Class built in Go without
// an Affinity gets the defaults).
func affinityDocOf(a Affinity) *affinityDoc {
	d := &affinityDoc{Mode: a.Mode, HotShare: nz(a.HotShare), SpreadMinPrefixTokens: nz(a.SpreadMinPrefixTokens),
		GroupMinPrefixTokens: nz(a.GroupMinPrefixTokens)}
	if a.Keys != nil {
		d.Keys = ptr(slices.Clone(a.Keys))
	}
	return d
}

func curveDocOf(c *Curve) *curveDoc {
	if c == nil {
		return nil
	}
	return &curveDoc{BaseMs: ptr(c.BaseMs), LinearMs: ptr(c.LinearMs), QueueMs: ptr(c.QueueMs)}
}
