#!/usr/bin/env python3
"""Check the tessel engine against Hugging Face transformers on the same weights (issue 6).

For tiny random-weight checkpoints written by transformers' save_pretrained (a Llama with
Llama-3 RoPE scaling and GQA, a Qwen2 with q/k/v biases, a GPT-2), in float32 and bfloat16, and
optionally the real SmolLM2-135M GGUF, this runs

  * transformers (eager attention, cuda if available): greedy decoding of --steps tokens from
    fixed prompt ids, and one teacher-forced forward over the prompt + tessel's tokens;
  * `tessel run --prompt-ids ... --temperature 0 --ignore-eos --dump-logits F.npy --backend B`;

and compares, per step, max|logits_tessel - logits_hf| / max|logits_hf| (the logits of the same
context: teacher-forced, so the comparison stays meaningful after a token divergence) and the
greedy tokens. Tolerances and their rationale: docs/engine.md, "Checking against Hugging Face".

  python3 tools/llm/hf_compare.py --tessel build/tessel --backend cpu --backend gpu \\
      --smollm2 .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf --json out.json
  python3 tools/llm/hf_compare.py --self-test --tessel build/tessel   # numpy only

Exit status 0 when every record passes, 1 otherwise.
"""
import argparse
import ast
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = [[3, 17, 256, 999, 41, 5, 77, 128, 64], [12, 600, 8]]  # ids < vocab 1000
# SmolLM2 ids (as in tests/test_llm_model.cpp): the chat-formatted "What is the capital of
# France?" and the plain "Once upon a time".
SMOL_PROMPTS = [[1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
                [6403, 1980, 253, 655]]
BF16_U = 2.0**-8  # bf16 relative spacing (8 significand bits): rounding error <= u/2
F32_TOL = 1e-3


def tolerance(precision, n_layers):
    """Relative logit tolerance (see docs/engine.md). bf16: 2L+2 rounding points on the path
    to the logits (the residual stream after each of the 2L branches, the final norm, the
    logits), each off by <= u/2 of the scale, summed linearly, for two independently rounding
    implementations: (2L+2) * u."""
    if precision == "f32":
        return F32_TOL
    return (2 * n_layers + 2) * BF16_U


# ---- NPY (the engine's --dump-logits format) -----------------------------------------------


def read_npy_f32(path):
    """Reads an NPY v1.0 float32 C-order file as written by tessel (src/llm/logits_dump.cpp)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY" or data[6:8] != b"\x01\x00":
        raise ValueError(f"{path}: not an NPY v1.0 file")
    (hlen,) = struct.unpack("<H", data[8:10])
    if (10 + hlen) % 64 or data[10 + hlen - 1:10 + hlen] != b"\n":
        raise ValueError(f"{path}: header not padded to 64 bytes / not ended by a newline")
    header = ast.literal_eval(data[10:10 + hlen].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"]:
        raise ValueError(f"{path}: expected <f4 C order, got {header}")
    shape = tuple(header["shape"])
    arr = np.frombuffer(data, dtype="<f4", offset=10 + hlen)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {arr.size} values for shape {shape}")
    # numpy's own reader must agree (the format is meant for np.load).
    ref = np.load(path)
    assert ref.shape == shape and np.array_equal(ref, arr.reshape(shape), equal_nan=True)
    return arr.reshape(shape)


def run_tessel(tessel, model, prompts, steps, backend, workdir, threads=0):
    """Greedy `tessel run`: returns (generated ids per prompt, logits (seqs, steps, vocab))."""
    dump = os.path.join(workdir, f"logits_{backend}.npy")
    cmd = [tessel, "run", "--model", model, "--temperature", "0", "--max-tokens", str(steps),
           "--ignore-eos", "--dump-logits", dump, "--backend", backend,
           "--context", str(max(len(p) for p in prompts) + steps + 1)]
    if threads:
        cmd += ["--threads", str(threads)]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {r.returncode}\n{r.stderr}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if len(lines) < len(prompts):
        raise RuntimeError(f"expected {len(prompts)} id lines, got:\n{r.stdout}")
    ids = [[int(x) for x in ln.split()] for ln in lines[-len(prompts):]]
    logits = read_npy_f32(dump)
    if logits.shape[:2] != (len(prompts), steps):
        raise RuntimeError(f"logits shape {logits.shape}, expected ({len(prompts)}, {steps}, V)")
    return ids, logits


def compare(hf_logits, hf_ids, ts_logits, ts_ids, tol):
    """hf_logits: (steps, V) on tessel's context; ids: the two greedy runs. Returns a dict."""
    steps = hf_logits.shape[0]
    scale = np.maximum(np.abs(hf_logits).max(axis=1), 1e-30)
    diff = np.abs(ts_logits[:steps].astype(np.float64) - hf_logits.astype(np.float64))
    rel = diff.max(axis=1) / scale  # NaN (missing step) propagates and fails the check
    err = float(np.max(rel)) if np.all(np.isfinite(rel)) else float("inf")
    first_div = next((t for t in range(steps) if t >= len(ts_ids) or t >= len(hf_ids)
                      or ts_ids[t] != hf_ids[t]), None)
    # A divergence is explained when HF's own top-2 margin there is within the tolerance band.
    margin = None
    if first_div is not None:
        top2 = np.sort(hf_logits[first_div])[-2:]
        margin = float((top2[1] - top2[0]) / scale[first_div])
    return {"rel_err_per_step": [float(x) for x in rel], "max_abs_logit_err": err,
            "max_abs_logit_err_raw": float(np.nanmax(diff)), "logit_scale": float(scale.max()),
            "tokens_identical": first_div is None, "first_divergence": first_div,
            "margin_at_divergence": margin, "within_tolerance": err <= tol}


# ---- transformers side -------------------------------------------------------------------


def tiny_config(kind):
    import transformers as tf
    common = dict(vocab_size=1000, max_position_embeddings=256, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    # Head dim 64 (hidden 512 / 8 heads): the GPU backend's attention takes D in {64, 128, 256}.
    if kind == "llama3":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
        return tf.LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5,
                              rope_parameters=rope, tie_word_embeddings=False, **common)
    if kind == "qwen2":
        return tf.Qwen2Config(hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                              num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-6,
                              rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                              use_sliding_window=False, tie_word_embeddings=True, **common)
    if kind == "gpt2":
        return tf.GPT2Config(vocab_size=1000, n_positions=256, n_embd=512, n_layer=4, n_head=8,
                             activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    raise ValueError(kind)


def randomize(model, seed):
    """O(1) activations and logits with clear top-1 margins (HF's 0.02-std init gives logits
    near zero, where any rounding flips the argmax)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            kind = type(mod).__name__
            for pname, p in mod.named_parameters(recurse=False):
                if kind == "Embedding":
                    std = 1.0 if p.shape[0] > 300 else 0.5  # tokens / GPT-2 positions
                    new = torch.randn(p.shape, generator=g) * std
                elif "Norm" in kind:
                    base = 1.0 if pname == "weight" else 0.0
                    new = base + (torch.rand(p.shape, generator=g) - 0.5) * 0.4
                elif pname == "bias":
                    new = (torch.rand(p.shape, generator=g) - 0.5) * 0.4
                else:
                    fan_in = p.shape[0] if kind == "Conv1D" else p.shape[1]  # GPT-2 (in, out)
                    new = torch.randn(p.shape, generator=g) / fan_in**0.5
                p.copy_(new.to(p.dtype))


def hf_load(path, dtype, device, gguf_file=None):
    from transformers import AutoModelForCausalLM
    kw = dict(attn_implementation="eager")
    if gguf_file:
        kw["gguf_file"] = gguf_file
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, **kw)
    return m.to(device).eval()


def hf_greedy(model, prompt, steps, device):
    """Greedy ids through the KV cache, and teacher-forced logits for any continuation."""
    import torch
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        out = model(input_ids=ids, use_cache=True)
        past, toks = out.past_key_values, []
        logits = out.logits[0, -1].float()
        for t in range(steps):
            tok = int(torch.argmax(logits))
            toks.append(tok)
            if t + 1 == steps:
                break
            out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=past,
                        use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1].float()
    return toks


def hf_forced_logits(model, prompt, continuation, steps, device):
    """Logits (steps, V) after prompt + continuation[:t] for t = 0..steps-1 (one forward)."""
    import torch
    seq = list(prompt) + list(continuation[:steps - 1])
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq], device=device), use_cache=False)
    return out.logits[0, len(prompt) - 1:len(prompt) - 1 + steps].float().cpu().numpy()


def check_model(args, name, model_path, gguf_file, prompts, dtype_name, n_layers, device,
                workdir, records, require_tokens):
    import torch
    tdtype = torch.float32 if dtype_name == "float32" else torch.bfloat16
    hf = hf_load(model_path, tdtype, device, gguf_file)
    hf_ids = [hf_greedy(hf, p, args.steps, device) for p in prompts]
    for backend in args.backend:
        precision = "f32" if dtype_name == "float32" and (
            backend == "cpu" or args.gpu_precision == "f32") else "bf16"
        tol = tolerance(precision, n_layers)
        target = os.path.join(model_path, gguf_file) if gguf_file else model_path
        try:
            ts_ids, ts_logits = run_tessel(args.tessel, target, prompts, args.steps, backend,
                                           workdir, args.threads)
        except RuntimeError as e:
            print(f"[{name} {dtype_name} {backend}] tessel failed: {e}", file=sys.stderr)
            records.append({"model": name, "backend": backend, "dtype": dtype_name,
                            "max_abs_logit_err": None, "tolerance": tol,
                            "tokens_identical": False, "steps": args.steps, "passed": False,
                            "error": str(e)[-2000:]})
            continue
        per = [compare(hf_forced_logits(hf, p, ts_ids[i], args.steps, device), hf_ids[i],
                       ts_logits[i], ts_ids[i], tol) for i, p in enumerate(prompts)]
        identical = all(c["tokens_identical"] for c in per)
        explained = all(c["tokens_identical"] or (c["margin_at_divergence"] is not None
                                                  and c["margin_at_divergence"] <= 2 * tol)
                        for c in per)
        ok = all(c["within_tolerance"] for c in per) and (
            identical if require_tokens or precision == "f32" else explained)
        records.append({"model": name, "backend": backend, "dtype": dtype_name,
                        "compute": precision,
                        "max_abs_logit_err": max(c["max_abs_logit_err"] for c in per),
                        "tolerance": tol, "tokens_identical": identical, "steps": args.steps,
                        "passed": ok, "prompts": prompts, "hf_tokens": hf_ids,
                        "tessel_tokens": ts_ids, "per_prompt": per})
    del hf


def print_table(records):
    print(f"{'model':<10} {'backend':<7} {'dtype':<9} {'rel err':>10} {'tol':>9} "
          f"{'tokens':>9} {'steps':>5}  result")
    for r in records:
        err = "-" if r["max_abs_logit_err"] is None else f"{r['max_abs_logit_err']:.3e}"
        div = [c["first_divergence"] for c in r.get("per_prompt", [])]
        tok = "same" if r["tokens_identical"] else f"div@{div}"
        print(f"{r['model']:<10} {r['backend']:<7} {r['dtype']:<9} {err:>10} "
              f"{r['tolerance']:>9.2e} {tok:>9} {r['steps']:>5}  "
              f"{'PASS' if r['passed'] else 'FAIL'}")


def has_module(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def git_commit():
    # TESSEL_COMMIT first: a device copy of the tree may carry stale git metadata.
    if os.environ.get("TESSEL_COMMIT"):
        return os.environ["TESSEL_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main_compare(args):
    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()
    if torch.cuda.is_available() and not args.hf_cpu:
        device, gpu = "cuda", torch.cuda.get_device_name(0)
    else:
        device, gpu = "cpu", None
    # Exact float32 on the GPU: no TF32 in the reference.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    records, skipped = [], []
    workdir = tempfile.mkdtemp(prefix="tessel_hf_")
    try:
        for i, kind in enumerate(args.models):
            for dtype_name in args.dtypes:
                folder = os.path.join(workdir, f"{kind}_{dtype_name}")
                from transformers import AutoModelForCausalLM
                cfg = tiny_config(kind)
                torch.manual_seed(1234 + i)
                model = AutoModelForCausalLM.from_config(cfg)
                randomize(model, 1234 + i)
                model = model.to(torch.float32 if dtype_name == "float32" else torch.bfloat16)
                try:
                    model.save_pretrained(folder, safe_serialization=True)
                except TypeError:  # transformers versions without the argument: always safe
                    model.save_pretrained(folder)
                del model
                n_layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
                check_model(args, kind, folder, None, PROMPTS, dtype_name, n_layers, device,
                            workdir, records, require_tokens=False)
        # transformers' GGUF loader needs the `gguf` and `accelerate` packages.
        missing = [m for m in ("gguf", "accelerate") if args.smollm2 and not has_module(m)]
        if missing:
            print(f"smollm2: python package(s) {', '.join(missing)} missing; skipped",
                  file=sys.stderr)
            skipped.append(f"smollm2 (missing {', '.join(missing)})")
        elif args.smollm2:
            path = os.path.abspath(args.smollm2)
            # transformers dequantizes the GGUF to float32: the same values tessel computes with.
            check_model(args, "smollm2", os.path.dirname(path), os.path.basename(path),
                        SMOL_PROMPTS, "float32", 30, device, workdir, records,
                        require_tokens=True)
    finally:
        if args.keep:
            print(f"files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(records)
    out = {"gpu": gpu, "commit": git_commit(), "hf_device": device,
           "transformers": transformers.__version__, "torch": torch.__version__,
           "skipped": skipped, "records": records}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if records and all(r["passed"] for r in records) else 1


# ---- self-test: numpy only ---------------------------------------------------------------


def write_safetensors_f32(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def numpy_llama_logits(w, cfg, seq):
    """float64 forward of HF's Llama (rotate_half RoPE), logits of every position."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, T = H // nh, cfg["rms_norm_eps"], len(seq)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    inv = cfg["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(x):  # (T, heads, hd)
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[:, None] + rot * sin[:, None]

    x = w["model.embed_tokens.weight"][seq].astype(np.float64)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"model.layers.{i}.{n}"].astype(np.float64)  # noqa: E731
        h = rms(x, p("input_layernorm.weight"))
        q = rope((h @ p("self_attn.q_proj.weight").T).reshape(T, nh, hd))
        k = rope((h @ p("self_attn.k_proj.weight").T).reshape(T, nkv, hd))
        v = (h @ p("self_attn.v_proj.weight").T).reshape(T, nkv, hd)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hts,shd->thd", s, v).reshape(T, H)
        x = x + a @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"))
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"].astype(np.float64))
    return x @ w["lm_head.weight"].astype(np.float64).T


def self_test(args):
    """The tessel side without torch: a tiny Llama folder written with numpy, `tessel run` with
    --prompt-ids/--dump-logits, the NPY reader, and logits against a float64 numpy forward."""
    rng = np.random.default_rng(7)
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 97,
           "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kvd = H // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    w = {"model.embed_tokens.weight": rng.standard_normal((V, H)),
         "model.norm.weight": 1 + 0.2 * rng.uniform(-1, 1, H),
         "lm_head.weight": rng.standard_normal((V, H)) / np.sqrt(H)}
    for i in range(cfg["num_hidden_layers"]):
        for n, shape in [("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (kvd, H)),
                         ("self_attn.v_proj", (kvd, H)), ("self_attn.o_proj", (H, H)),
                         ("mlp.gate_proj", (F, H)), ("mlp.up_proj", (F, H)),
                         ("mlp.down_proj", (H, F))]:
            w[f"model.layers.{i}.{n}.weight"] = rng.standard_normal(shape) / np.sqrt(shape[1])
        for n in ("input_layernorm", "post_attention_layernorm"):
            w[f"model.layers.{i}.{n}.weight"] = 1 + 0.2 * rng.uniform(-1, 1, H)
    w = {k: v.astype(np.float32) for k, v in w.items()}
    workdir = tempfile.mkdtemp(prefix="tessel_hf_selftest_")
    failures = []
    try:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(cfg, f)
        write_safetensors_f32(os.path.join(workdir, "model.safetensors"), w)
        prompts, steps = [[5, 60, 7, 91, 33], [2, 40]], 12
        ids, logits = run_tessel(args.tessel, workdir, prompts, steps, "cpu", workdir, 2)
        if logits.shape != (2, steps, V):
            failures.append(f"logits shape {logits.shape}")
        for i, p in enumerate(prompts):
            if len(ids[i]) != steps:
                failures.append(f"prompt {i}: {len(ids[i])} ids, expected {steps}")
            if list(np.argmax(logits[i], axis=1)) != ids[i]:
                failures.append(f"prompt {i}: argmax of the dumped logits != printed ids")
            ref = numpy_llama_logits(w, cfg, p + ids[i][:steps - 1])[len(p) - 1:]
            ref_ids = []
            for _ in range(steps):  # the reference's own greedy run
                ctx = p + ref_ids
                ref_ids.append(int(np.argmax(numpy_llama_logits(w, cfg, ctx)[-1])))
            c = compare(ref, ref_ids, logits[i], ids[i], 1e-4)
            print(f"self-test prompt {i}: max rel err {c['max_abs_logit_err']:.2e} (tol 1e-4), "
                  f"tokens {'same' if c['tokens_identical'] else 'differ'}")
            if not (c["within_tolerance"] and c["tokens_identical"]):
                failures.append(f"prompt {i}: {c}")
        # The reader rejects a corrupt file.
        bad = os.path.join(workdir, "bad.npy")
        with open(os.path.join(workdir, "logits_cpu.npy"), "rb") as f:
            raw = bytearray(f.read())
        raw[6] = 2
        with open(bad, "wb") as f:
            f.write(raw)
        try:
            read_npy_f32(bad)
            failures.append("read_npy_f32 accepted a version-2 header")
        except ValueError:
            pass
        # tessel's own checks: an out-of-vocab id is an error.
        try:
            run_tessel(args.tessel, workdir, [[5, V]], 2, "cpu", workdir, 2)
            failures.append(f"tessel accepted id {V} with vocab {V}")
        except RuntimeError as e:
            if "prompt-ids" not in str(e):
                failures.append(f"unexpected error text: {e}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    print("self-test:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessel", default="build/tessel", help="the tessel CLI binary")
    ap.add_argument("--backend", action="append", choices=["cpu", "gpu"],
                    help="tessel backend(s) to check (repeatable; default cpu)")
    ap.add_argument("--models", default="llama3,qwen2,gpt2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--smollm2", help="path of the SmolLM2 GGUF (compared in float32)")
    ap.add_argument("--gpu-precision", choices=["bf16", "f32"], default="bf16",
                    help="what the GPU backend computes in: picks the tolerance")
    ap.add_argument("--threads", type=int, default=0, help="tessel CPU threads (0 = all)")
    ap.add_argument("--hf-cpu", action="store_true", help="run transformers on the CPU")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkpoints")
    ap.add_argument("--self-test", action="store_true",
                    help="numpy only: the tessel side against a numpy forward")
    args = ap.parse_args()
    args.backend = args.backend or ["cpu"]
    args.models = [m for m in args.models.split(",") if m]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    if not os.path.exists(args.tessel):
        ap.error(f"--tessel {args.tessel}: no such file")
    if args.self_test:
        return self_test(args)
    return main_compare(args)


if __name__ == "__main__":
    sys.exit(main())
