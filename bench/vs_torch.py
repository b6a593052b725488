#!/usr/bin/env python3
"""tessel ops vs PyTorch eager and torch.compile, on the same tensors, through the Python
bindings. Writes the JSON schema of the C++ bench (bench/harness.hpp):

  {gpu, commit, date, suite: "vs_torch", peaks: {copy_GBps, bf16_TFLOPs},
   records: [{op, case, shape, dtype, metric, ours, baseline, baseline_value, ratio,
              peak_fraction, target, target_met, ours_ms, baseline_ms, check, check_detail}]}

Timing as the C++ harness: CUDA events around each iteration, warm-up, median of >= 20,
L2 flushed before every iteration (a 2x L2 buffer is read outside the events); all iterations
are queued before the one wait at the end, so the events time the GPU, not the host.
Peaks measured the same way: torch copy of 1 GiB (bytes read + written), torch.mm 8192^3 bf16.
Targets: ours/torch eager >= 1.3 and ours/torch.compile >= 1.0 for every case.

Cases live in a registry (CASES, filled by @case): each returns a CaseSpec with `ours` and
`torch_fn` callables on pre-allocated tensors; torch.compile wraps torch_fn. Ops from other
families are probed with hasattr and skipped (printed) when missing. Later issues add cases
(attention, ...) with @case.

  python3 bench/vs_torch.py --json OUT.json [--ops a,b] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (os.path.join(ROOT, "build-py", "python"),):
    if os.path.isdir(p) and p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tessel  # noqa: E402

EAGER_TARGET = 1.3
COMPILE_TARGET = 1.0


# ---- timing ----------------------------------------------------------------------------------
class Timer:
    def __init__(self, warmup=3, iters=20):
        self.warmup, self.iters = warmup, max(iters, 20)
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)
        self.scratch = torch.ones(2 * l2 // 4, dtype=torch.int32, device="cuda")

    def flush(self):
        # Read, as the C++ harness does: a written buffer (zero_(), triton's do_bench) leaves
        # ~L2-size of dirty lines whose write-back lands inside the next timed op (the embedding
        # forward measured 0.115 ms here against 0.095 ms in the C++ suite).
        self.scratch.sum()

    def measure(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            self.flush()
            fn()
        torch.cuda.synchronize()
        # Every iteration is queued before any is waited for (as triton.testing.do_bench and
        # tessel's C++ harness do): the host's per-call work (Python, argument checks, launch)
        # overlaps the GPU's, for ours and torch's alike, and the events time the GPU. Waiting
        # after each iteration let host time leak in whenever it outlasted the L2 flush: the
        # same rms_norm read 2834 and 2115 GB/s in two runs of the synchronizing version.
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for a, b in zip(starts, ends):
            self.flush()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def measure_peaks(timer: Timer) -> dict:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timer.measure(lambda: dst.copy_(src))
    copy = 2 * n / (ms * 1e-3) / 1e9
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timer.measure(lambda: torch.mm(a, b))
    tf = 2 * 8192**3 / (ms * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return {"copy_GBps": copy, "bf16_TFLOPs": tf}


# ---- registry --------------------------------------------------------------------------------
@dataclass
class CaseSpec:
    op: str
    case: str
    shape: dict
    dtype: str
    metric: str  # "GB/s" or "TFLOP/s"
    amount: float  # bytes or flops per call
    ours: Callable[[], object]
    torch_fn: Callable[[], object]
    check: Callable[[], tuple] | None = None  # -> (ok, detail), after one call of each
    compile_fn: Callable[[], object] | None = None  # default: torch.compile(torch_fn)
    # Other baselines than torch eager / torch.compile (e.g. SDPA backends):
    # [(name, fn, target ratio)]; when given, these replace the default two.
    baselines: list | None = None
    flags: dict = field(default_factory=dict)  # top-level JSON booleans, e.g. {"causal": True}


@dataclass
class Case:
    op: str
    build: Callable[[bool], list]  # quick -> [CaseSpec]
    needs: tuple = ()  # tessel attributes that must exist


CASES: list[Case] = []


def case(op, needs=()):
    def deco(fn):
        CASES.append(Case(op, fn, tuple(needs)))
        return fn

    return deco


def close(a, b, rtol=2e-2, atol=1e-3):
    a, b = a.float(), b.float()
    err = (a - b).abs().max().item() if a.numel() else 0.0
    ok = bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    return ok, f"max_abs_err={err:.3g}"


def dev(*shape, dtype=torch.bfloat16, lo=-1.0, hi=1.0):
    return torch.empty(*shape, device="cuda", dtype=dtype).uniform_(lo, hi)


def _bytes(*ts):
    return float(sum(t.numel() * t.element_size() for t in ts))


# ---- cases: core ops -------------------------------------------------------------------------
@case("softmax_fwd", needs=("softmax",))
def _softmax_fwd(quick):
    r, c = (4096, 4096) if quick else (16384, 8192)
    x = dev(r, c, lo=-4, hi=4)
    y = torch.empty_like(x)
    ref = [None]

    def t():
        ref[0] = torch.softmax(x, -1)
        return ref[0]

    return [CaseSpec("softmax_fwd", f"{r}x{c}", {"rows": r, "cols": c}, "bf16", "GB/s",
                     _bytes(x, y), lambda: tessel.softmax(x, y), t, lambda: close(y, ref[0]))]


@case("softmax_bwd", needs=("softmax_backward",))
def _softmax_bwd(quick):
    r, c = (4096, 4096) if quick else (16384, 8192)
    y = torch.softmax(dev(r, c, lo=-4, hi=4), -1)
    dy = dev(r, c)
    dx = torch.empty_like(y)
    ref = [None]

    def t():
        ref[0] = torch._softmax_backward_data(dy, y, -1, y.dtype)
        return ref[0]

    return [CaseSpec("softmax_bwd", f"{r}x{c}", {"rows": r, "cols": c}, "bf16", "GB/s",
                     _bytes(y, dy, dx), lambda: tessel.softmax_backward(y, dy, dx), t,
                     lambda: close(dx, ref[0], atol=1e-4))]


@case("add", needs=("add",))
def _add(quick):
    r, c = (4096, 4096) if quick else (16384, 8192)
    a, b = dev(r, c), dev(r, c)
    out = torch.empty_like(a)
    ref = [None]

    def t():
        ref[0] = a + b
        return ref[0]

    return [CaseSpec("add", f"{r}x{c} same-shape", {"rows": r, "cols": c}, "bf16", "GB/s",
                     _bytes(a, b, out), lambda: tessel.add(a, b, out), t,
                     lambda: close(out, ref[0]))]


# ---- cases: loss / optim / shape (this family) -------------------------------------------------
@case("cross_entropy", needs=("cross_entropy",))
def _ce(quick):
    n, v = (1024, 128256) if quick else (4096, 128256)
    x = dev(n, v, lo=-4, hi=4)
    tgt = torch.randint(0, v, (n,), device="cuda")
    loss = torch.empty((), device="cuda", dtype=torch.float32)
    dl = torch.empty_like(x)
    xl = x.detach().clone().requires_grad_(True)
    ref = {}

    def t():
        xl.grad = None
        lo = F.cross_entropy(xl, tgt)
        lo.backward()
        ref["loss"], ref["grad"] = lo, xl.grad
        return lo

    def chk():
        ok1, d1 = close(loss, ref["loss"].float(), rtol=1e-2, atol=1e-2)
        ok2, d2 = close(dl, ref["grad"], rtol=2e-2, atol=1e-6)
        return ok1 and ok2, f"loss {d1}; dlogits {d2}"

    return [CaseSpec("cross_entropy", f"{n}x{v} loss+dlogits (fwd+bwd), mean",
                     {"rows": n, "vocab": v}, "bf16", "GB/s", 2 * _bytes(x),
                     lambda: tessel.cross_entropy(x, tgt, loss, dl), t, chk)]


@case("fused_linear_cross_entropy", needs=("fused_linear_cross_entropy",))
def _flce(quick):
    n, h, v = (1024, 2048, 32768) if quick else (4096, 4096, 128256)
    hid = dev(n, h)
    w = dev(v, h, lo=-0.05, hi=0.05)
    tgt = torch.randint(0, v, (n,), device="cuda")
    loss = torch.empty((), device="cuda", dtype=torch.float32)
    dh = torch.empty_like(hid)
    dw = torch.empty(v, h, device="cuda", dtype=torch.float32)
    hl = hid.detach().clone().requires_grad_(True)
    wl = w.detach().clone().requires_grad_(True)
    ref = {}

    def t():
        hl.grad = None
        wl.grad = None
        lo = F.cross_entropy((hl @ wl.t()).float(), tgt)
        lo.backward()
        ref["loss"], ref["dh"], ref["dw"] = lo, hl.grad, wl.grad
        return lo

    def chk():
        ok1, d1 = close(loss, ref["loss"].float(), rtol=1e-2, atol=1e-2)
        ok2, d2 = close(dh, ref["dh"], rtol=5e-2, atol=1e-5)
        return ok1 and ok2, f"loss {d1}; dhidden {d2}"

    return [CaseSpec("fused_linear_cross_entropy",
                     f"N={n} H={h} V={v} loss+dhidden+dweight; torch: matmul + CE(float) + backward",
                     {"rows": n, "hidden": h, "vocab": v}, "bf16", "TFLOP/s", 6.0 * n * h * v,
                     lambda: tessel.fused_linear_cross_entropy(hid, w, tgt, loss, dh, dw), t, chk)]


@case("adamw", needs=("adamw",))
def _adamw(quick):
    k, each = (16, 1 << 20) if quick else (64, 2 << 20)
    ps = [dev(each, dtype=torch.float32) for _ in range(k)]
    gs = [dev(each, dtype=torch.float32) for _ in range(k)]
    ms = [torch.zeros(each, device="cuda") for _ in range(k)]
    vs = [torch.zeros(each, device="cuda") for _ in range(k)]
    tp = [torch.nn.Parameter(p.clone()) for p in ps]
    for p, g in zip(tp, gs):
        p.grad = g.clone()
    opt = torch.optim.AdamW(tp, lr=1e-3, weight_decay=1e-2, foreach=True)
    opt.step()  # creates state
    step = [1]

    group = tessel.AdamW(ps, gs, ms, vs)  # lists converted once, as an optimizer would

    def ours():
        step[0] += 1
        group.step(lr=1e-3, weight_decay=1e-2, step=min(step[0], 1000))

    compiled_step = torch.compile(opt.step)

    return [CaseSpec("adamw", f"{k} tensors x {each}, f32 (torch: AdamW foreach)",
                     {"tensors": k, "numel": each}, "f32", "GB/s", 28.0 * k * each, ours,
                     lambda: opt.step(), None, compile_fn=lambda: compiled_step())]


@case("concat", needs=("concat",))
def _concat(quick):
    r = 2048 if quick else 8192
    a, b, c = dev(r, 4096), dev(r, 1024), dev(r, 1024)
    out = torch.empty(r, 6144, device="cuda", dtype=torch.bfloat16)
    ref = [None]

    def t():
        ref[0] = torch.cat([a, b, c], -1)
        return ref[0]

    return [CaseSpec("concat", f"({r},4096)|({r},1024)|({r},1024) axis -1",
                     {"rows": r, "cols": 6144}, "bf16", "GB/s", 2 * _bytes(out),
                     lambda: tessel.concat([a, b, c], out, -1), t,
                     lambda: (bool(torch.equal(out, ref[0])), "bit-exact"))]


@case("transpose_batched", needs=("transpose_batched",))
def _tb(quick):
    b, r, c = (8, 4096, 1024) if quick else (32, 4096, 1024)
    x = dev(b, r, c)
    y = torch.empty(b, c, r, device="cuda", dtype=torch.bfloat16)
    ref = [None]

    def t():
        ref[0] = x.transpose(1, 2).contiguous()
        return ref[0]

    return [CaseSpec("transpose_batched", f"({b},{r},{c})->({b},{c},{r})",
                     {"batch": b, "rows": r, "cols": c}, "bf16", "GB/s", 2 * _bytes(x),
                     lambda: tessel.transpose_batched(x, y), t,
                     lambda: (bool(torch.equal(y, ref[0])), "bit-exact"))]


# ---- cases: other families (probed; signatures as in their ops_<family>.py) ---------------------
@case("rms_norm", needs=("rms_norm",))
def _rms(quick):
    r, c = (4096, 4096) if quick else (16384, 4096)
    x, w = dev(r, c), dev(c)
    y = torch.empty_like(x)
    ref = [None]

    def t():
        ref[0] = F.rms_norm(x, (c,), w, 1e-6)
        return ref[0]

    return [CaseSpec("rms_norm", f"{r}x{c}", {"rows": r, "cols": c}, "bf16", "GB/s",
                     _bytes(x, y, w), lambda: tessel.rms_norm(x, w, y, eps=1e-6), t,
                     lambda: close(y, ref[0]))]


@case("layer_norm", needs=("layer_norm",))
def _ln(quick):
    r, c = (4096, 4096) if quick else (16384, 4096)
    x, w, b = dev(r, c), dev(c), dev(c)
    y = torch.empty_like(x)
    ref = [None]

    def t():
        ref[0] = F.layer_norm(x, (c,), w, b, 1e-5)
        return ref[0]

    return [CaseSpec("layer_norm", f"{r}x{c}", {"rows": r, "cols": c}, "bf16", "GB/s",
                     _bytes(x, y, w, b), lambda: tessel.layer_norm(x, w, b, y, eps=1e-5), t,
                     lambda: close(y, ref[0]))]


@case("silu_and_mul", needs=("silu_and_mul",))
def _silu_mul(quick):
    r, c = (4096, 4096) if quick else (16384, 14336)
    x = dev(r, 2 * c)
    y = torch.empty(r, c, device="cuda", dtype=torch.bfloat16)
    ref = [None]

    def t():
        ref[0] = F.silu(x[:, :c]) * x[:, c:]
        return ref[0]

    return [CaseSpec("silu_and_mul", f"{r}x{2 * c} -> {r}x{c}", {"rows": r, "cols": c}, "bf16",
                     "GB/s", _bytes(x, y), lambda: tessel.silu_and_mul(x, y), t,
                     lambda: close(y, ref[0]))]


@case("embedding", needs=("embedding",))
def _emb(quick):
    n, v, h = (4096, 32000, 4096) if quick else (16384, 128256, 4096)
    w = dev(v, h)
    ids = torch.randint(0, v, (n,), device="cuda")
    out = torch.empty(n, h, device="cuda", dtype=torch.bfloat16)
    ref = [None]

    def t():
        ref[0] = F.embedding(ids, w)
        return ref[0]

    return [CaseSpec("embedding", f"{n} ids, ({v},{h})", {"ids": n, "vocab": v, "hidden": h},
                     "bf16", "GB/s", 2 * _bytes(out), lambda: tessel.embedding(ids, w, out), t,
                     lambda: (bool(torch.equal(out, ref[0])), "bit-exact"))]


# ---- cases of other families: bench/vs_torch_<family>.py, run in this module's namespace --------
# (they use case, CaseSpec, dev, close, _bytes, tessel, torch, F directly).
for _p in sorted(os.listdir(os.path.dirname(os.path.abspath(__file__)))):
    if _p.startswith("vs_torch_") and _p.endswith(".py"):
        _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _p)
        with open(_path) as _f:
            exec(compile(_f.read(), _path, "exec"), globals())


# ---- driver ----------------------------------------------------------------------------------
def commit():
    if os.environ.get("TESSEL_COMMIT"):
        return os.environ["TESSEL_COMMIT"]
    try:
        return subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:
        return "unknown"


def value(spec, ms):
    if spec.metric == "TFLOP/s":
        return spec.amount / (ms * 1e-3) / 1e12
    return spec.amount / (ms * 1e-3) / 1e9


def run_spec(spec: CaseSpec, timer: Timer, peaks: dict) -> list[dict]:
    base = {"op": spec.op, "case": spec.case,
            "shape": [[k, int(v)] for k, v in spec.shape.items()], "dtype": spec.dtype,
            "metric": spec.metric, **{k: bool(v) for k, v in spec.flags.items()}}
    peak = peaks["copy_GBps"] if spec.metric == "GB/s" else peaks["bf16_TFLOPs"]
    check, detail = "OK", ""
    try:
        spec.ours()
        spec.torch_fn()
        torch.cuda.synchronize()
        if spec.check is not None:
            ok, detail = spec.check()
            check = "OK" if ok else "FAIL"
    except Exception as e:  # ours failed: record and go on
        traceback.print_exc()
        check, detail = "ERROR", f"{type(e).__name__}: {e}"
    ours_ms = timer.measure(spec.ours) if check != "ERROR" else 0.0
    ours = value(spec, ours_ms) if ours_ms > 0 else 0.0
    if spec.baselines is not None:
        baselines = list(spec.baselines)
    else:
        baselines = [("torch eager", spec.torch_fn, EAGER_TARGET)]
        comp = spec.compile_fn
        if comp is None:
            comp = torch.compile(spec.torch_fn)
        baselines.append(("torch.compile", comp, COMPILE_TARGET))
    out = []
    for name, fn, target in baselines:
        rec = dict(base)
        rec.update({"ours": ours, "ours_ms": ours_ms, "baseline": name, "check": check,
                    "check_detail": detail, "target": f"ratio>={target:g}"})
        try:
            fn()
            torch.cuda.synchronize()
            bms = timer.measure(fn)
            bv = value(spec, bms)
        except Exception as e:
            print(f"  {spec.op}: baseline {name} failed: {type(e).__name__}: {e}")
            bms, bv = 0.0, 0.0
            rec["check_detail"] = (detail + f"; baseline {name} failed: {e}").strip("; ")
        rec["baseline_ms"] = bms
        rec["baseline_value"] = bv
        rec["ratio"] = ours / bv if bv > 0 else 0.0
        rec["peak_fraction"] = ours / peak if peak > 0 else 0.0
        rec["target_met"] = bool(check == "OK" and rec["ratio"] >= target)
        out.append(rec)
        print(f"  {spec.op:28s} {spec.case[:44]:44s} ours {ours:9.1f} {spec.metric:7s} "
              f"{name:13s} {bv:9.1f}  ratio {rec['ratio']:5.2f} (>= {target:g}: "
              f"{'met' if rec['target_met'] else 'MISSED'})  peak {rec['peak_fraction']:.2f} "
              f"[{check}]")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="output file")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer iterations")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU found")
        return 1
    want = {o.strip() for o in args.ops.split(",") if o.strip()}
    timer = Timer(warmup=2 if args.quick else 3, iters=args.iters)
    peaks = measure_peaks(timer)
    print(f"peaks: copy {peaks['copy_GBps']:.0f} GB/s, bf16 mm {peaks['bf16_TFLOPs']:.0f} TFLOP/s")
    records, skipped = [], []
    for c in CASES:
        if want and c.op not in want:
            continue
        missing = [n for n in c.needs if not hasattr(tessel, n)]
        if missing:
            skipped.append(f"{c.op} (tessel.{', tessel.'.join(missing)} missing)")
            continue
        try:
            specs = c.build(args.quick)
        except Exception as e:
            skipped.append(f"{c.op} (setup failed: {type(e).__name__}: {e})")
            continue
        for s in specs:
            try:
                records.extend(run_spec(s, timer, peaks))
            except Exception as e:
                traceback.print_exc()
                skipped.append(f"{s.op} (run failed: {type(e).__name__}: {e})")
        del specs
        torch.cuda.empty_cache()
    for s in skipped:
        print(f"skipped: {s}")
    doc = {"gpu": torch.cuda.get_device_name(0), "commit": commit(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "suite": "vs_torch", "peaks": peaks, "records": records, "skipped": skipped}
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    met = sum(r["target_met"] for r in records)
    print(f"{met}/{len(records)} targets met; wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
