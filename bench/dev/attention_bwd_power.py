"""Development probe (not part of the build): SM clock and board power while one attention
backward runs alone, back to back, for a few seconds: tessel's, torch SDPA's flash and cuDNN
backends, on the tensors bench/vs_torch_attention_bwd.py uses (bf16, B4 H32 S4096 D128).

Why: the vs-torch ratio of the backward moved by 3-5 % from GPU to GPU for the same code while
flash's rate did not (docs/attention_backward.md, sessions 37-38). This prints, per kernel, the
rate, the median SM clock and power, the share of samples that nvidia-smi flags as held by the
software power cap, and the energy per TFLOP: which kernels run at the cap.

    PYTHONPATH=build-py/python python3 bench/dev/attention_bwd_power.py [seconds per kernel]
"""
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tessel

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
POWER_CAP_BIT = 0x4  # clocks_event_reasons: SW power cap


class Sampler:
    """nvidia-smi every 50 ms in the background: (time, SM MHz, W, reasons)."""

    def __init__(self):
        self.samples, self._stop = [], False
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
             "--format=csv,noheader,nounits", "-lms", "50"],
            stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((time.time(), float(parts[0]), float(parts[1]),
                                     int(parts[2], 16)))
            except (ValueError, IndexError):
                pass

    def window(self, t0, t1):
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def close(self):
        self._proc.terminate()


def dev(*shape, lo=-1.0, hi=1.0):
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16).uniform_(lo, hi)


def main():
    b, h, s, d = 4, 32, 4096, 128
    sampler = Sampler()
    time.sleep(1.0)
    print(f"B{b} H{h} S{s} D{d} bf16, {SECONDS:.0f} s per kernel")
    print(f"{'kernel':<28} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'capped':>7} {'J/PFLOP':>8}")
    for causal in (False, True):
        q = dev(b, h, s, d, lo=-2.0, hi=2.0)
        k, v, g = dev(b, h, s, d), dev(b, h, s, d), dev(b, h, s, d)
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        tessel.attention_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 o.transpose(1, 2), lse, causal=causal)
        grads = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]

        def ours():
            tessel.attention_backward(*(t.transpose(1, 2) for t in (q, k, v, o, g)), lse,
                                      *(t.transpose(1, 2) for t in grads), causal=causal)

        def sdpa(backend):
            qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
            return lambda: torch.autograd.grad(out, (qr, kr, vr), g, retain_graph=True)

        flops = 2.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        for name, fn in (("tessel", ours), ("flash SDPA", sdpa(SDPBackend.FLASH_ATTENTION)),
                         ("cuDNN SDPA", sdpa(SDPBackend.CUDNN_ATTENTION)), ("tessel", ours)):
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            time.sleep(0.5)  # cool down between kernels a little
            t0 = time.time()
            calls = 0
            while time.time() - t0 < SECONDS:
                for _ in range(10):
                    fn()
                calls += 10
                torch.cuda.synchronize()
            t1 = time.time()
            rate = flops * calls / (t1 - t0) / 1e12
            win = sampler.window(t0 + 0.5, t1)  # past the first half second
            if not win:
                print(f"{name:<28} {rate:8.1f}  (no samples)")
                continue
            mhz = statistics.median(x[1] for x in win)
            watts = statistics.median(x[2] for x in win)
            capped = sum(1 for x in win if x[3] & POWER_CAP_BIT) / len(win)
            label = f"{name} {'causal' if causal else 'non-causal'}"
            print(f"{label:<28} {rate:8.1f} {mhz:7.0f} {watts:6.0f} {capped:7.0%} "
                  f"{watts / rate * 1e3:8.1f}")
    sampler.close()


if __name__ == "__main__":
    main()
