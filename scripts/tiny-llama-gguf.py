#!/usr/bin/env python3
"""Writes the tiny model the llama.cpp tests and demo serve (scripts/setup.sh --engines).

No model can be downloaded on the test machines, so this makes one: a
llama-architecture GGUF with random weights (a fixed seed: the same file every
time) and a real tokenizer, GPT-2's byte-level BPE from the tokenizer.json the
project ships (internal/tokens/hf/testdata). llama-server then tokenizes,
prefills, caches prompt prefixes and decodes exactly as it does for a real
model; only the text it generates is noise.

The size is chosen for 2 shared CPU cores: a 2,000-token prefill takes about
a second on one thread, a cached one (a conversation's next turn) a few tens
of milliseconds, and decoding is a few milliseconds a token (most of it the
50,257-way output projection). The file is about 40 MB.

Usage: tiny-llama-gguf.py TOKENIZER_JSON[.gz] OUT.gguf
"""

import gzip
import json
import sys

import numpy as np
import gguf

# Shapes: 4 layers of width 256 (4 heads of 64), a 1024-wide SwiGLU.
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 256, 4, 4, 4, 1024
N_CTX_TRAIN = 8192
SEED = 24

# A ChatML template: llama-server renders it (with or without --jinja), and
# GPT-2's vocabulary tokenizes its markers as plain text (about 7 tokens per
# message), well inside the fleet's chat_template_tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def load_tokenizer(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"{path}: want a BPE tokenizer, got {model.get('type')!r}")
    vocab = model["vocab"]
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    n = max(max(vocab.values()), max(added, default=-1)) + 1
    tokens = [None] * n
    for text, i in vocab.items():
        tokens[i] = text
    for i, a in added.items():
        tokens[i] = a["content"]
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise SystemExit(f"{path}: token ids without a token: {missing[:5]}")
    types = [gguf.TokenType.NORMAL] * n
    for i, a in added.items():
        types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eos = next((i for i, a in added.items() if a["content"] == "<|endoftext|>"), n - 1)
    return tokens, types, merges, eos


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    tokens, types, merges, eos = load_tokenizer(sys.argv[1])
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    w = gguf.GGUFWriter(sys.argv[2], "llama")
    w.add_name("inferlb-tiny-llama")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def mat(rows, cols):
        # Small random weights keep the activations finite through the
        # layers; the output is noise either way.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(N_EMBD, dtype=np.float32)
    head_dim = N_EMBD // N_HEAD
    # token_embd doubles as the output projection (llama.cpp ties them when
    # output.weight is absent).
    w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD))
    w.add_tensor("output_norm.weight", ones)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_HEAD_KV * head_dim, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
