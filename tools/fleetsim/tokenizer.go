package fleetsim

import (
	"slices"
	"sync"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// The simulated engines count tokens with the project's word rule
// (internal/tokens: runs of non-whitespace bytes), and a deployment's
// ext_proc loads its model's tokenizer.json (--tokenizer) so that requests
// near a class's context limit are counted exactly rather than bounded by
// their bytes. Without one, the byte bound put every simulated prompt above
// 32 KiB — 5–6k tokens of the simulator's words — into the long-context
// class (the H100s only) while the rivals, routed by the exact count, used
// every engine. The simulated ext_procs load simTokenizerJSON instead: a
// tokenizer.json that counts one token per whitespace-separated word, as
// the engines do for the workloads' words (at most 7 letters, under
// tokens.MaxTokenBytes; TestSimTokenizerCountsLikeTheEngines).
const simTokenizerJSON = `{"pre_tokenizer": {"type": "WhitespaceSplit"}, "model": {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"}}`

var simTok = sync.OnceValues(func() (*hf.Tokenizer, error) { return hf.Parse([]byte(simTokenizerJSON)) })

// withSimTokenizer is spec with every model naming the simulator's
// tokenizer (fleet.Model.TokenizerSHA256, which the control plane
// publishes in RoutingPolicy); the models are copied, not changed.
func withSimTokenizer(spec *fleet.Spec) (*fleet.Spec, *hf.Tokenizer, error) {
	tok, err := simTok()
	if err != nil {
		return nil, nil, err
	}
	sp := *spec
	sp.Models = slices.Clone(spec.Models)
	for i := range sp.Models {
		sp.Models[i].TokenizerSHA256 = tok.SHA256()
	}
	return &sp, tok, nil
}
