#!/usr/bin/env python3
"""End-to-end bench (issue 6, suite "e2e"): a Llama-3.1-8B-shaped model with random bf16 weights,
written by transformers' save_pretrained on this machine, run by `tessel run --backend gpu` and by
transformers (eager, bf16) as the baseline, in the same session.

Records (bench JSON schema): op e2e_prefill (1 x --prompt tokens) and e2e_decode (batch 1 and 16,
--new-tokens each), metric tok/s, shape {batch, prompt, new_tokens, params}; for decode,
peak_fraction = achieved weight bandwidth (weight bytes x steps / decode time) / measured copy
bandwidth.

  python3 bench/e2e.py --tessel build/tessel --json e2e.json [--layers 32] [--dir /tmp/llama8b]

tessel's figures are those its CLI prints ("prefill N tok in T s", "decode N tok in T s"): the
whole step loop including host work, one process per case, CUDA_MODULE_LOADING=EAGER and the
autotuner off so no first-use work lands in the timed region. transformers: median of 3 timed
runs after one warm-up, torch.cuda.synchronize() around each.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch


def llama8b_config(tf, layers):
    return tf.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})


def copy_bandwidth():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(ts) / 1e9


def hf_times(model, prompt_len, batch, new_tokens):
    """(prefill s for 1 x prompt_len, decode s per step at `batch`), medians of 3."""
    ids1 = torch.randint(0, 128000, (1, prompt_len), device="cuda")

    def prefill():
        with torch.no_grad():
            model(ids1, use_cache=True)

    def gen(b, n):
        ids = torch.randint(0, 128000, (b, 16), device="cuda")
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_prefill = timed(prefill)
    # Decode time per step: generate n and 1 new tokens, the difference over n - 1 steps.
    t_n = timed(lambda: gen(batch, new_tokens))
    t_1 = timed(lambda: gen(batch, 1))
    return t_prefill, (t_n - t_1) / (new_tokens - 1)


# The CLI's own rates (computed from unrounded times; the printed seconds are rounded).
SUMMARY = re.compile(r"prefill \d+ tok in [0-9.]+ s \(([0-9.]+) tok/s\), "
                     r"decode \d+ tok in [0-9.]+ s \(([0-9.]+) tok/s\)")


def tessel_times(tessel, folder, batch, prompt_len, new_tokens):
    ids = ",".join(str(1000 + (i * 7919) % 120000) for i in range(prompt_len))
    cmd = [tessel, "run", "--model", folder, "--backend", "gpu", "--temperature", "0",
           "--ignore-eos", "--max-tokens", str(new_tokens), "--context", str(prompt_len + new_tokens + 8)]
    for _ in range(batch):
        cmd += ["--prompt-ids", ids]
    env = dict(os.environ, CUDA_MODULE_LOADING="EAGER", TESSEL_AUTOTUNE="0")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    text = out.stdout + out.stderr
    m = SUMMARY.search(text)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"tessel run failed (rc {out.returncode}): {text[-2000:]}")
    return float(m.group(1)), float(m.group(2)), text


def record(op, batch, prompt, new, params, ours, base, peak_fraction, detail):
    return {"op": op, "case": f"llama3.1-8b-shape b{batch} prompt {prompt} new {new}",
            "shape": {"batch": batch, "prompt": prompt, "new_tokens": new, "params": params},
            "dtype": "bf16", "metric": "tok/s", "ours": ours, "baseline": "transformers eager",
            "baseline_value": base, "ratio": ours / base if base > 0 else 0.0,
            "peak_fraction": peak_fraction, "check": "OK", "check_detail": detail,
            "target": "", "target_met": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessel", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--dir", default="/tmp/tessel_e2e_llama8b")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()
    import transformers as tf

    torch.manual_seed(0)
    copy_gbps = copy_bandwidth()
    cfg = llama8b_config(tf, args.layers)
    t0 = time.time()
    with torch.device("cuda"):
        model = tf.LlamaForCausalLM._from_config(cfg, torch_dtype=torch.bfloat16,
                                                 attn_implementation="eager")
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = 2.0 * params
    if not os.path.exists(os.path.join(args.dir, "config.json")):
        model.save_pretrained(args.dir, safe_serialization=True)
    print(f"model: {params / 1e9:.2f} B params, written in {time.time() - t0:.0f} s", flush=True)

    hf = {}
    for b in (1, 16):
        hf[b] = hf_times(model, args.prompt, b, args.new_tokens)
        print(f"transformers b{b}: prefill {args.prompt / hf[b][0]:.0f} tok/s, "
              f"decode {b / hf[b][1]:.1f} tok/s", flush=True)
    del model
    torch.cuda.empty_cache()

    records = []
    for b in (1, 16):
        prefill_tps, decode_tps, text = tessel_times(args.tessel, args.dir, b, args.prompt,
                                                     args.new_tokens)
        print(f"tessel b{b}: prefill {prefill_tps:.0f} tok/s, decode {decode_tps:.1f} tok/s",
              flush=True)
        hf_decode = b / hf[b][1]
        # Every decode step streams every weight once: bandwidth = bytes x steps / time.
        steps_per_s = decode_tps / b
        bw = weight_bytes * steps_per_s / 1e9
        records.append(record("e2e_decode", b, args.prompt, args.new_tokens, params, decode_tps,
                              hf_decode, bw / copy_gbps, f"weight bandwidth {bw:.0f} GB/s"))
        if b == 1:
            records.append(record("e2e_prefill", 1, args.prompt, 0, params, prefill_tps,
                                  args.prompt / hf[1][0], 0.0, "prefill of one prompt"))
    doc = {"gpu": torch.cuda.get_device_name(0), "commit": os.environ.get("TESSEL_COMMIT", "unknown"),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "suite": "e2e", "peaks": {"copy_GBps": copy_gbps}, "records": records}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    for r in records:
        print(f"{r['op']:12s} {r['case']:44s} ours {r['ours']:9.1f} tok/s  transformers "
              f"{r['baseline_value']:9.1f}  ratio {r['ratio']:.2f}  peak {r['peak_fraction']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
