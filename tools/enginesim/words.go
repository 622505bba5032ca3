package enginesim

// words are the simulator's output vocabulary: 2–7 lowercase letters, so
// each is exactly one token under package tokens' rule.
var words = [...]string{
	"the", "model", "answers", "with", "tokens", "from", "an", "fixed", "list",
	"so", "every", "run", "is", "the", "same", "load", "router", "sees",
	"only", "timing", "and", "length", "of", "each", "reply", "which", "follow",
	"profile", "under", "batch", "cache", "queue", "engine", "region", "prompt",
	"stream", "step", "decode", "prefill", "block", "hash", "prefix", "warm",
	"cold", "fast", "slow", "busy", "idle", "token", "reply", "word", "text",
	"simple", "steady", "clear", "plain", "short", "long", "next", "turn",
	"again", "more", "less", "done",
}

// word returns output token i of a request whose words start at offset off.
func word(off uint64, i int) string { return words[(off+uint64(i))%uint64(len(words))] }
