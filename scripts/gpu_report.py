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


KERNELS = ["torch_flash", "fp16", "K2V2g128", "K4V4g128", "K2V2g32"]
PACKED = ["K2V2g128", "K4V4g128", "K2V2g32"]


def table(dec, copy, key):
    """One table of times `key` (ms: one call, graph_ms: per layer in a graph)."""
    head = "| B | Hkv | kv_len | " + " | ".join(f"{k} ms" for k in KERNELS)
    head += " | " + " | ".join(f"{k} %bw" for k in PACKED) + " | " + " | ".join(f"torch/{k}" for k in PACKED) + " |"
    print(head)
    print("|" + "---|" * (3 + len(KERNELS) + 2 * len(PACKED)))
    for shape in sorted(dec):
        d = dec[shape]
        ms = lambda k: float(d[k].get(key, "nan")) if k in d else math.nan
        pct = lambda k: 100 * float(d[k]["bytes"]) / (ms(k) * 1e-3) / 1e9 / copy if k in d and ms(k) > 0 else math.nan
        t = ms("torch_flash")
        # "-": not measured (an fp16 history larger than the benchmark allocates, or a packed cache
        # that did not fit)
        fmt = lambda v, f: "-" if math.isnan(v) else f.format(v)
        cells = ([fmt(ms(k), "{:.4f}") for k in KERNELS] + [fmt(pct(k), "{:.0f}%") for k in PACKED] +
                 [fmt(t / ms(k), "{:.2f}x") for k in PACKED])
        print(f"| {shape[0]} | {shape[1]} | {shape[2]} | " + " | ".join(cells) + " |")


def main():
    rows = []
    for p in sys.argv[1:]:
        rows += parse(p)
    copy = next((float(r["gbs"]) for r in rows if r["what"] == "copy"), float("nan"))
    dec = defaultdict(dict)
    for r in rows:
        if r["what"] == "decode":
            dec[(int(r["B"]), int(r["Hkv"]), int(r["T"]))][r["kernel"]] = r
    print(f"copy bandwidth {copy:.0f} GB/s (read + write)")
    print("\nOne call between two events (the host's enqueue included):\n")
    table(dec, copy, "ms")
    if any("graph_ms" in r for d in dec.values() for r in d.values()):
        print("\nPer layer, L layers of their own memory replayed as one CUDA graph (cold L2, no host time):\n")
        table(dec, copy, "graph_ms")


if __name__ == "__main__":
    main()
