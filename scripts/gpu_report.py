"""Merges bench_cuda's and bench_torch_sdpa.py's RESULT lines into the
decode table of docs/performance.md: time per step, bytes read, GB/s, share
of copy bandwidth, and speed-up over PyTorch's fp16 flash attention."""
import math
import sys
from collections import defaultdict


def parse(path):
    rows = []
    for line in open(path, errors="replace"):
        if not line.startswith("RESULT "):
            continue
        parts = line.split()
        d = {"what": parts[1]}
        for p in parts[2:]:
            if "=" in p:
                k, v = p.split("=", 1)
                d[k] = v
        rows.append(d)
    return rows


def main():
    rows = []
    for p in sys.argv[1:]:
        rows += parse(p)
    copy = next((float(r["gbs"]) for r in rows if r["what"] == "copy"), float("nan"))
    dec = defaultdict(dict)
    for r in rows:
        if r["what"] == "decode":
            dec[(int(r["B"]), int(r["Hkv"]), int(r["T"]))][r["kernel"]] = (float(r["ms"]), float(r["bytes"]))
    kernels = ["torch_flash", "fp16", "K2V2g128", "K4V4g128", "K2V2g32"]
    print(f"copy bandwidth {copy:.0f} GB/s (read + write)")
    print("| B | Hkv | kv_len | " + " | ".join(f"{k} ms" for k in kernels) + " | K2V2g128 %bw | K4V4g128 %bw | K2V2g32 %bw | torch/K2V2g128 | torch/K4V4g128 | torch/K2V2g32 |")
    print("|" + "---|" * (3 + len(kernels) + 6))
    for key in sorted(dec):
        d = dec[key]
        ms = lambda k: d.get(k, (math.nan, 0))[0]
        pct = lambda k: 100 * d[k][1] / (d[k][0] * 1e-3) / 1e9 / copy if k in d and d[k][0] > 0 else math.nan
        t = ms("torch_flash")
        cells = [f"{ms(k):.4f}" for k in kernels]
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) +
              f" | {pct('K2V2g128'):.0f}% | {pct('K4V4g128'):.0f}% | {pct('K2V2g32'):.0f}% | {t / ms('K2V2g128'):.2f}x | {t / ms('K4V4g128'):.2f}x | {t / ms('K2V2g32'):.2f}x |")


if __name__ == "__main__":
    main()
