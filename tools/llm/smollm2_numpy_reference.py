#!/usr/bin/env python3
"""Independent reference for the engine's SmolLM2 test (tests/test_llm_model.cpp).

Dequantizes the GGUF with gguf-py (not tessel's code), undoes llama.cpp's q/k row permutation to
get the Hugging Face layout back, and runs a float64 Llama forward in numpy with HF's rotate_half
RoPE. Prints each prompt's greedy tokens (with the top-1/top-2 logit margins) and the first-step
top-5 logits that the C++ test compares against.

  python3 -m pip install --target /tmp/pyref numpy==2.4.6 gguf==0.19.0
  PYTHONPATH=/tmp/pyref python3 tools/llm/smollm2_numpy_reference.py .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

PROMPTS = [
    # <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    # Once upon a time
    [6403, 1980, 253, 655],
]
EOS = 2
MAX_NEW = 24


def main(path):
    r = gguf.GGUFReader(path)

    def kv(key):
        f = r.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    w = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    n_layers = kv("llama.block_count")
    hidden = kv("llama.embedding_length")
    n_heads = kv("llama.attention.head_count")
    n_kv = kv("llama.attention.head_count_kv")
    theta = kv("llama.rope.freq_base")
    eps = kv("llama.attention.layer_norm_rms_epsilon")
    d = hidden // n_heads

    def unpermute(m, heads):  # llama.cpp stores q/k rows pair-interleaved per head
        return m.reshape(heads, d // 2, 2, m.shape[1]).swapaxes(1, 2).reshape(m.shape)

    for i in range(n_layers):
        w[f"blk.{i}.attn_q.weight"] = unpermute(w[f"blk.{i}.attn_q.weight"], n_heads)
        w[f"blk.{i}.attn_k.weight"] = unpermute(w[f"blk.{i}.attn_k.weight"], n_kv)
    inv_freq = theta ** (-np.arange(0, d, 2) / d)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rotate_half(x):
        return np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)

    def last_logits(toks):
        n = len(toks)
        x = w["token_embd.weight"][toks]
        ang = np.arange(n)[:, None] * inv_freq[None]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(n_layers):
            g = f"blk.{i}."
            h = rms(x, w[g + "attn_norm.weight"])
            q = (h @ w[g + "attn_q.weight"].T).reshape(n, n_heads, d).transpose(1, 0, 2)
            k = (h @ w[g + "attn_k.weight"].T).reshape(n, n_kv, d).transpose(1, 0, 2)
            v = (h @ w[g + "attn_v.weight"].T).reshape(n, n_kv, d).transpose(1, 0, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = np.repeat(k, n_heads // n_kv, 0), np.repeat(v, n_heads // n_kv, 0)
            s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            x = x + (p @ v).transpose(1, 0, 2).reshape(n, hidden) @ w[g + "attn_output.weight"].T
            h = rms(x, w[g + "ffn_norm.weight"])
            gate = h @ w[g + "ffn_gate.weight"].T
            up = h @ w[g + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[g + "ffn_down.weight"].T
        head = w.get("output.weight", w["token_embd.weight"])
        return rms(x[-1], w["output_norm.weight"]) @ head.T

    for prompt in PROMPTS:
        l0 = last_logits(prompt)
        top = np.argsort(l0)[::-1][:5]
        print("first-step top5", [(int(i), round(float(l0[i]), 4)) for i in top])
        toks, out, margins = list(prompt), [], []
        for _ in range(MAX_NEW):
            l = l0 if not out and len(toks) == len(prompt) else last_logits(toks)
            srt = np.sort(l)[::-1]
            margins.append(round(float(srt[0] - srt[1]), 3))
            t = int(np.argmax(l))
            if t == EOS:
                break
            out.append(t)
            toks.append(t)
        print("greedy", out)
        print("top1-top2 margins", margins)


if __name__ == "__main__":
    main(sys.argv[1])
