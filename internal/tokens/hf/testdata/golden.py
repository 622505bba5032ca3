#!/usr/bin/env python3
"""Writes golden.json: token counts of a test corpus under the shipped
tokenizers, computed by the Hugging Face tokenizers library (the Rust
implementation the servers use). TestGolden checks the Go loader against it.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install tokenizers
    /tmp/v/bin/python internal/tokens/hf/testdata/golden.py
"""
import gzip
import json
import os
import random

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["gpt2", "qwen3", "minilm"]

CORPUS = [
    "",
    "hello",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Answer in one word.",
    "I'm sure you'll see they're right; we've DON'T can't I'M",
    "It's 3.14159 or 2.71828, not 1,000,000 or 1234567890123.",
    "0123456789" * 20,
    "!!!???...---***+++===",
    "a  b   c    d",
    "a\tb\t\tc",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nnewlines first",
    "line one\nline two\r\nline three\n\n",
    "  \n  indented after newline",
    "x \n\ty",
    "def f(x):\n    return x * 2  # doubled\n\nprint(f(21))\n",
    "func main() {\n\tfmt.Println(\"hi\")\n}\n",
    '{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}',
    "<html><body><p class=\"x\">Hello &amp; welcome</p></body></html>",
    "https://example.com/path?query=1&b=two#frag",
    "SGVsbG8gV29ybGQhIFRoaXMgaXMgYmFzZTY0IGVuY29kZWQgdGV4dC4=" * 3,
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "日本語のテキストです。カタカナとひらがな。",
    "한국어 문장입니다. 감사합니다!",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε ΣΟΦΟΣ",
    "café naïve résumé Ångström Zürich façade",
    "e\u0301 a\u0308 combining marks n\u0303",
    "👍🏽 🇺🇸 👨‍👩‍👧 🤖🚀✨",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "[CLS] hello [SEP] [MASK] [PAD] [UNK]",
    "\x00\x01\x02 control \x7f\x1b[31mred\x1b[0m",
    "\u0958\u0959\u095a \ufb2a\ufb2c\ufb4e \u2126\u212b",
    "ﬁ ﬂ ½ ¼ ﷺ ㍿ ㎒ Ⅻ ℡ ⁵",
    "a\u200bb\u200cc\u200dd\ufeffe",
    "a\u00a0b\u2009c\u3000d\u202fe",
    "x\u2028y\u2029z\u0085w\x0bv\x0cu",
    "İstanbul ǅ ß ẞ Σίσυφος ΣΑΣ",
    "a" * 500,
    "=" * 300,
    " " * 100 + "x",
    "\n" * 50,
    "ab" * 300,
    "The year 2024 had 366 days; 12:30pm, $45.99, 50%, #1, @user, user@example.com",
    "A" * 10 + " " + "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 20,
    "'s 'S 'll 'LL 'Re 've 'd 'm ' s",
    "\t\t\tdeeply\t\tindented\t",
    "mixed   \t \n  whitespace \r\n\t kinds",
    "Emoji👍in😀text🎉without spaces",
    "tab\tseparated\tvalues\n1\t2\t3\n",
    "<|im_start|>system<|im_end|><|endoftext|><|im_start|>",
    "ends with a space ",
    " ",
    "\t",
    "\n",
    "  ",
]

POOLS = [
    "abcdefghijklmnopqrstuvwxyz",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    " " * 8 + "\t\n\r",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "éèêëàâäôöûüçñßøåæœ",
    "你好世界中文字符测试数据",
    "ひらがなカタカナ漢字",
    "абвгдежзийклмнопрст",
    "αβγδεζηθικλμνξοπρστ",
    "مرحباعالم",
    "👍😀🎉🚀🤖✨",
    "\u0958\ufb2a\u2126ﬁ½\u200b\u00a0\u3000\u0301",
    "<|>[]",
]


def random_corpus(n, seed):
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        length = rnd.randint(1, 200)
        pools = rnd.sample(POOLS, rnd.randint(1, 4))
        chars = "".join(pools)
        out.append("".join(rnd.choice(chars) for _ in range(length)))
    return out


def main():
    toks = {}
    for name in NAMES:
        with gzip.open(os.path.join(HERE, name + ".tokenizer.json.gz"), "rt", encoding="utf-8") as f:
            t = Tokenizer.from_str(f.read())
        t.no_padding()
        t.no_truncation()
        toks[name] = t
    cases = []
    # One object per line keeps diffs readable.
    for text in CORPUS + random_corpus(400, 14):
        counts = {n: len(t.encode(text, add_special_tokens=False).ids) for n, t in toks.items()}
        cases.append({"text": text, "counts": counts})
    with open(os.path.join(HERE, "golden.json"), "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(c, ensure_ascii=True, separators=(",", ":")) for c in cases))
        f.write("\n]\n")


if __name__ == "__main__":
    main()
