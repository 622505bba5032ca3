package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The document types mirror Spec with pointers for the fields a user may
// omit, so that the defaults step can tell "omitted" (nil: fill the default)
// from "given" (validate it, never replace it). Their YAML keys must equal
// Spec's (a test checks).
type specDoc struct {
	Name       string         `yaml:"name"`
	Regions    []Region       `yaml:"regions"`
	Network    networkDoc     `yaml:"network"`
	Models     []modelDoc     `yaml:"models"`
	Profiles   []profileDoc   `yaml:"profiles"`
	Classes    *[]classDoc    `yaml:"classes"`
	Priorities *[]priorityDoc `yaml:"priorities"`
	Frontends  []Frontend     `yaml:"frontends"`
	Engines    []engineDoc    `yaml:"engines"`
}

type networkDoc struct {
	SameRegionRTTMs *float64  `yaml:"same_region_rtt_ms"`
	Links           []linkDoc `yaml:"links"`
}

type linkDoc struct {
	A     string   `yaml:"a"`
	B     string   `yaml:"b"`
	RTTMs *float64 `yaml:"rtt_ms"`
}

type modelDoc struct {
	Name               string `yaml:"name"`
	MaxContextTokens   *int   `yaml:"max_context_tokens"`
	Tokenizer          string `yaml:"tokenizer"`
	TokenizerSHA256    string `yaml:"-"` // derived; kept by New
	ChatTemplateTokens *int   `yaml:"chat_template_tokens"`
}

type profileDoc struct {
	GPU                string    `yaml:"gpu"`
	Model              string    `yaml:"model"`
	PrefillTokensPerS  *float64  `yaml:"prefill_tokens_per_s"`
	OverheadMs         *float64  `yaml:"overhead_ms"`
	DecodeStepMs       *float64  `yaml:"decode_step_ms"`
	DecodeStepPerSeqMs *float64  `yaml:"decode_step_per_seq_ms"`
	MaxRunning         *int      `yaml:"max_running"`
	MaxBatchedTokens   *int      `yaml:"max_batched_tokens"`
	KVCapacityTokens   *int      `yaml:"kv_capacity_tokens"`
	BlockSize          *int      `yaml:"block_size"`
	MaxContextTokens   *int      `yaml:"max_context_tokens"`
	CapacityRPS        *float64  `yaml:"capacity_rps"`
	TTFTCurve          *curveDoc `yaml:"ttft_curve"`
	TBOTCurve          *curveDoc `yaml:"tbot_curve"`
}

type curveDoc struct {
	BaseMs   *float64 `yaml:"base_ms"`
	LinearMs *float64 `yaml:"linear_ms"`
	QueueMs  *float64 `yaml:"queue_ms"`
}

type classDoc struct {
	Name             string       `yaml:"name"`
	Model            string       `yaml:"model"`
	Residency        string       `yaml:"residency"`
	MinContextTokens *int         `yaml:"min_context_tokens"`
	MeanPromptTokens *float64     `yaml:"mean_prompt_tokens"`
	MeanOutputTokens *float64     `yaml:"mean_output_tokens"`
	Affinity         *affinityDoc `yaml:"affinity"`
}

type affinityDoc struct {
	Mode                  string    `yaml:"mode"`
	Keys                  *[]string `yaml:"keys"`
	HotShare              *float64  `yaml:"hot_share"`
	SpreadMinPrefixTokens *int      `yaml:"spread_min_prefix_tokens"`
	GroupMinPrefixTokens  *int      `yaml:"group_min_prefix_tokens"`
}

type priorityDoc struct {
	Name     string   `yaml:"name"`
	Level    *int     `yaml:"level"`
	ShedCost *float64 `yaml:"shed_cost"`
}

type engineDoc struct {
	ID         string            `yaml:"id"`
	Address    string            `yaml:"address"`
	Region     string            `yaml:"region"`
	GPU        string            `yaml:"gpu"`
	Model      string            `yaml:"model"`
	Replicas   *int              `yaml:"replicas"`
	Labels     map[string]string `yaml:"labels"`
	Server     string            `yaml:"server"`
	HealthPath string            `yaml:"health_path"`
}

// maxNodes bounds the YAML nodes the schema walk visits, aliases expanded,
// so an alias bomb that fits in MaxSpecBytes cannot make Parse slow.
const maxNodes = 1 << 20

// decode turns YAML into a specDoc. Before decoding it walks the node tree
// against the document types, so that unknown keys and values of the wrong
// kind are reported with their field path (all of them, not the first), and
// it records the line of every path for error messages.
func decode(data []byte) (*specDoc, map[string]int, []*FieldError) {
	var d specDoc
	lines, errs, ok := decodeStrict(data, &d, "spec")
	if !ok {
		return nil, lines, errs
	}
	return &d, lines, errs
}

// DecodeStrict decodes one YAML document into out, a pointer to a struct
// built of the kinds the fleet spec itself uses (structs with yaml tags,
// pointers, slices, maps with string keys, strings, ints, float64s and
// bools), the way Parse decodes a spec: unknown keys and values of the
// wrong kind are reported, all of them, as FieldErrors with their field
// path and line, and lines maps every path to its input line for later
// validation errors. A problem that stops decoding (bad YAML, alias cycles,
// more than one document) leaves out partly filled; other problems still
// decode the rest. what names the document in messages ("spec",
// "scenario"). Other inferlb files (e.g. simulator scenarios) use it so
// that their errors read like the fleet spec's.
func DecodeStrict(data []byte, out any, what string) (lines map[string]int, errs []*FieldError) {
	lines, errs, _ = decodeStrict(data, out, what)
	return lines, errs
}

func decodeStrict(data []byte, out any, what string) (map[string]int, []*FieldError, bool) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := recovering(func() error { return dec.Decode(&root) }); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, []*FieldError{{Msg: "empty " + what + ": no YAML document"}}, false
		}
		return nil, yamlErrors(err), false
	}
	var extra yaml.Node
	if err := recovering(func() error { return dec.Decode(&extra) }); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlErrors(err), false
		}
		if !emptyDocument(&extra) {
			return nil, []*FieldError{{Msg: "more than one YAML document; a " + what + " is one document", Line: extra.Line}}, false
		}
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil, []*FieldError{{Msg: "empty " + what + ": no YAML document"}}, false
	}
	w := &walker{lines: map[string]int{}, active: map[*yaml.Node]bool{}, what: what}
	doc := root.Content[0]
	w.walk(doc, reflect.TypeOf(out).Elem(), "")
	if w.nodes > maxNodes || w.hard {
		// Do not let the decoder expand it (cycles, bombs) or trip on
		// keys it cannot hash (yaml.v3 panics on a list key next to <<).
		return w.lines, w.errs, false
	}
	// Decode even if the walk found problems, so that validation can report
	// the rest of the document too: yaml.v3 skips unknown keys and leaves
	// values of the wrong kind unset (the walk reported both, by path).
	if err := recovering(func() error { return doc.Decode(out) }); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) || len(w.errs) == 0 {
			// Not a kind problem the walk saw: alias limits, mostly.
			return w.lines, append(w.errs, yamlErrors(err)...), false
		}
	}
	return w.lines, w.errs, true
}

// emptyDocument: a document with nothing in it, as a trailing "---" makes.
func emptyDocument(n *yaml.Node) bool {
	if len(n.Content) == 0 {
		return true
	}
	c := n.Content[0]
	return len(n.Content) == 1 && c.Kind == yaml.ScalarNode && c.ShortTag() == "!!null" && c.Value == ""
}

type walker struct {
	errs   []*FieldError
	lines  map[string]int
	nodes  int
	active map[*yaml.Node]bool // anchors being expanded, to refuse cycles
	what   string              // the document, in messages
	hard   bool                // a problem the decoder must not see
}

// spend counts a visited node; past maxNodes it reports once and says stop.
func (w *walker) spend(path string, n *yaml.Node) bool {
	w.nodes++
	if w.nodes == maxNodes+1 {
		w.errorf(path, n, "%s too complex: more than %d YAML nodes after expanding aliases", w.what, maxNodes)
	}
	return w.nodes <= maxNodes
}

// deref follows an alias. ok is false (and the problem reported) for an
// alias to a node being expanded: YAML anchors must not contain themselves.
func (w *walker) deref(n *yaml.Node, path string) (target *yaml.Node, ok bool) {
	if n.Kind != yaml.AliasNode {
		return n, true
	}
	if n.Alias == nil || w.active[n.Alias] {
		w.hard = true
		w.errorf(path, n, "alias *%s refers to a value that contains it", n.Value)
		return nil, false
	}
	return n.Alias, true
}

// errorf reports a problem at path; at the top ("") it names the document
// (w.what: "spec", "scenario").
func (w *walker) errorf(path string, n *yaml.Node, format string, args ...any) {
	if path == "" {
		path = w.what
	}
	w.errs = append(w.errs, &FieldError{Path: path, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "an alias"
}

// fieldIndex maps a struct type's YAML keys to field indexes.
func fieldIndex(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "-" {
			continue
		}
		if key == "" {
			key = strings.ToLower(f.Name)
		}
		m[key] = i
	}
	return m
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if !w.spend(path, n) {
		return
	}
	if n.Kind == yaml.AliasNode {
		target, ok := w.deref(n, path)
		if !ok {
			return
		}
		w.active[target] = true
		defer delete(w.active, target)
		n = target
	}
	if _, seen := w.lines[path]; !seen {
		w.lines[path] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // omitted
	}
	switch t.Kind() {
	case reflect.Pointer:
		w.walk(n, t.Elem(), path)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.errorf(path, n, "must be a mapping, got %s", kindName(n))
			return
		}
		w.walkMapping(n, t, path, fieldIndex(t))
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.errorf(path, n, "must be a list, got %s", kindName(n))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.Map: // map[string]string
		if n.Kind != yaml.MappingNode {
			w.errorf(path, n, "must be a mapping, got %s", kindName(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				w.hard = true
				w.errorf(path, k, "keys must be strings, got %s", kindName(k))
				continue
			}
			w.walk(v, t.Elem(), path+"."+k.Value)
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			w.errorf(path, n, "must be a string, got %s", kindName(n))
		}
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			w.errorf(path, n, "must be an integer, got %s", kindName(n))
			return
		}
		var v int64
		if err := n.Decode(&v); err != nil || v != int64(int(v)) {
			w.errorf(path, n, "integer %s out of range", n.Value)
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			w.errorf(path, n, "must be true or false, got %s", kindName(n))
		}
	case reflect.Float64:
		tag := n.ShortTag()
		if n.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") {
			w.errorf(path, n, "must be a number, got %s", kindName(n))
			return
		}
		var v float64
		if err := n.Decode(&v); err != nil {
			w.errorf(path, n, "number %s out of range", n.Value)
		} else if math.IsNaN(v) || math.IsInf(v, 0) {
			w.errorf(path, n, "must be a finite number, got %s", n.Value)
		}
	default:
		panic("fleet: walker does not handle " + t.String())
	}
}

func (w *walker) walkMapping(n *yaml.Node, t reflect.Type, path string, fields map[string]int) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && (k.Tag == "" || k.Tag == "!" || k.ShortTag() == "!!merge") {
			// Merge key: the merged mapping(s) hold keys of this struct.
			merged := []*yaml.Node{v}
			if v, ok := w.deref(v, path); !ok {
				continue
			} else if v.Kind == yaml.SequenceNode {
				merged = v.Content
			}
			for _, m := range merged {
				if !w.spend(path, m) {
					return
				}
				alias := m.Kind == yaml.AliasNode
				m, ok := w.deref(m, path)
				if !ok {
					continue
				}
				if m.Kind != yaml.MappingNode {
					w.hard = true
					w.errorf(path, m, "merge key << must refer to a mapping, got %s", kindName(m))
					continue
				}
				if alias {
					w.active[m] = true
				}
				w.walkMapping(m, t, path, fields)
				if alias {
					delete(w.active, m)
				}
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			w.hard = true
			w.errorf(path, k, "keys must be strings, got %s", kindName(k))
			continue
		}
		sub := k.Value
		if path != "" {
			sub = path + "." + k.Value
		}
		fi, ok := fields[k.Value]
		if !ok {
			w.errorf(sub, k, "unknown key")
			continue
		}
		w.walk(v, t.Field(fi).Type, sub)
	}
}

// lineOf finds the line of path, or of its nearest ancestor.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// recovering runs a yaml.v3 call, turning a panic inside it (it has a few
// on odd input) into an error.
func recovering(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: %v", r)
		}
	}()
	return f()
}

// yamlErrors turns a yaml.v3 error into one FieldError per problem, each
// with its line: "yaml: line 3: msg" and the lines of an "unmarshal errors"
// list alike.
func yamlErrors(err error) []*FieldError {
	msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]*FieldError, 0, len(msgs))
	for _, m := range msgs {
		fe := &FieldError{}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(m), "line "); ok {
			if n, msg, ok := strings.Cut(rest, ": "); ok {
				if line, err := strconv.Atoi(n); err == nil {
					fe.Line, m = line, msg
				}
			}
		}
		fe.Msg = "invalid YAML: " + m
		out = append(out, fe)
	}
	return out
}
