"""Development probe (not part of the build): SM clock and board power while one attention
backward runs alone, back to back, for a few seconds: tessel's, torch SDPA's flash and cuDNN
backends, on bench/vs_torch_attention_bwd.py's D128 cases (its tensors and calls).

Why: the vs-torch ratio of the backward moved by 3-5 % from GPU to GPU for the same code while
flash's rate did not (docs/attention_backward.md, sessions 37-38). This prints, per kernel, the
rate, the median SM clock and power, the share of samples that nvidia-smi flags as held by the
software power cap, and the energy per PFLOP: which kernels run at the cap.

    PYTHONPATH=build-py/python python3 bench/dev/attention_bwd_power.py [seconds per kernel]
"""
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
POWER_CAP_BIT = 0x4  # clocks_event_reasons: SW power cap


class Sampler:
    """nvidia-smi every 50 ms in the background: (time, SM MHz, W, reasons)."""

    def __init__(self):
        self.samples = []
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


def main():
    # The cases of bench/vs_torch_attention_bwd.py (importing vs_torch registers them): the same
    # tensors and calls as the records.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import vs_torch

    build = next(c.build for c in vs_torch.CASES if c.op == "attention_bwd")
    specs = [sp for sp in build(False) if sp.shape["D"] == 128]
    sampler = Sampler()
    time.sleep(1.0)
    print(f"{SECONDS:.0f} s per kernel")
    print(f"{'kernel':<46} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'capped':>7} {'J/PFLOP':>8}")
    for sp in specs:
        kernels = [("tessel", sp.ours)] + [(name, fn) for name, fn, _ in sp.baselines]
        for name, fn in kernels + kernels[:1]:  # tessel again last: drift within the case
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            time.sleep(0.5)  # a pause between kernels
            t0 = time.time()
            calls = 0
            while time.time() - t0 < SECONDS:
                for _ in range(10):
                    fn()
                calls += 10
                torch.cuda.synchronize()
            t1 = time.time()
            rate = sp.amount * calls / (t1 - t0) / 1e12
            label = f"{sp.case} {name}"
            win = sampler.window(t0 + 0.5, t1)  # past the first half second
            if not win:
                print(f"{label:<46} {rate:8.1f}  (no samples)")
                continue
            mhz = statistics.median(x[1] for x in win)
            watts = statistics.median(x[2] for x in win)
            capped = sum(1 for x in win if x[3] & POWER_CAP_BIT) / len(win)
            print(f"{label:<46} {rate:8.1f} {mhz:7.0f} {watts:6.0f} {capped:7.0%} "
                  f"{watts / rate * 1e3:8.1f}")
    sampler.close()


if __name__ == "__main__":
    main()
