#!/usr/bin/env python3
"""Concat probe (dev, device only): prints torch.compile's generated kernel for the vs_torch
concat case, then times tessel.concat, torch.compile and torch eager on the same tensors,
alternating, on fresh buffers and again after an allocation churn (the suite's slow state).
Timing as bench/vs_torch.py (events around each call, L2 flushed by a read, median)."""
import statistics
import sys

import torch

import tessel

R = 8192


def timer(fn, flush, iters=50, warm=5):
    for _ in range(warm):
        flush()
        fn()
    torch.cuda.synchronize()
    s = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    e = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for a, b in zip(s, e):
        flush()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(s, e))


def main():
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.ones(2 * l2 // 4, dtype=torch.int32, device="cuda")
    flush = lambda: scratch.sum()
    cat = lambda a, b, c: torch.cat([a, b, c], -1)
    ccat = torch.compile(cat)

    def tensors():
        a = torch.randn(R, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(R, 1024, device="cuda", dtype=torch.bfloat16)
        c = torch.randn(R, 1024, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(R, 6144, device="cuda", dtype=torch.bfloat16)
        return a, b, c, out

    a, b, c, out = tensors()
    if "--code" in sys.argv:
        from torch._inductor.utils import run_and_get_code
        _, codes = run_and_get_code(ccat, a, b, c)
        for code in codes:
            print(code)
    nbytes = 2 * out.numel() * out.element_size()
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def measure(tag, a, b, c, out):
        tessel.concat([a, b, c], out, -1)
        assert torch.equal(out, cat(a, b, c))
        for rnd in range(3):
            t = {
                "copy": timer(lambda: dst.copy_(src), flush),
                "ours": timer(lambda: tessel.concat([a, b, c], out, -1), flush),
                "compile": timer(lambda: ccat(a, b, c), flush),
                "eager": timer(lambda: cat(a, b, c), flush),
            }
            gbs = {k: nbytes / v / 1e6 for k, v in t.items()}
            gbs["copy"] = 2 * src.numel() / t["copy"] / 1e6
            print(f"{tag} r{rnd}: " + " ".join(f"{k} {v:.0f} GB/s ({v / gbs['copy']:.3f})" for k, v in gbs.items())
                  + f"  ours/compile {t['compile'] / t['ours']:.3f}", flush=True)

    measure("fresh", a, b, c, out)
    # The suite's slow state: earlier cases allocated and freed gigabytes.
    junk = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda").fill_(1) for _ in range(24)]
    del junk
    torch.cuda.empty_cache()
    big = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(6)]
    a2, b2, c2, out2 = tensors()
    measure("churned", a2, b2, c2, out2)
    del big


if __name__ == "__main__":
    main()
