"""Stall samples of one kernel, summed between marker instructions (development tool).

Reads the SASS source page that `ncu -i REPORT --page source --csv --print-source sass` prints
(gzip'd or plain) and prints, for every stretch of SASS that starts at a WGMMA group, a
wait (WARPGROUP.DEPBAR), a barrier or an mbarrier wait, the share of all warp stall samples
spent in it: where a warp-specialized kernel's time goes, phase by phase.
    python3 bench/dev/ncu_segments.py SOURCE.csv[.gz] [MIN_SHARE]
"""
import csv
import gzip
import io
import sys


def main():
    path = sys.argv[1]
    min_share = float(sys.argv[2]) if len(sys.argv) > 2 else 0.004
    raw = gzip.open(path) if path.endswith(".gz") else open(path, "rb")
    text = io.TextIOWrapper(raw, encoding="utf-8")
    text.readline()  # "Kernel Name", ...
    rows = [r for r in csv.DictReader(text) if r.get("Address", "").startswith("0x")]

    def samples(r):
        return int(r["Warp Stall Sampling (All Samples)"] or 0)

    total = sum(samples(r) for r in rows)
    markers = ("DEPBAR", "BAR.SYNC", "BAR.ARV", "WARPGROUP.ARRIVE", "TRYWAIT")
    label, acc, out = "start", 0, []
    for r in rows:
        src = r["Source"].strip()
        if any(m in src for m in markers) or ("HGMMA" in src and "RZ, !UPT" in src):
            out.append((label, acc))
            label, acc = r["Address"][-5:] + " " + src[:60], 0
        acc += samples(r)
    out.append((label, acc))
    print(f"{total} samples")
    for label, acc in out:
        if acc > total * min_share:
            print(f"{acc:8d} {acc / total:6.3f}  from {label}")


if __name__ == "__main__":
    main()
