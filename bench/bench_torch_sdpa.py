"""PyTorch fp16 decode attention (scaled_dot_product_attention, flash backend)
on the shapes of bench_cuda, timed with CUDA events as bench_cuda times its
kernels: one call between two events, and per layer in a CUDA graph of L
layers, each with keys and values of its own (L from the same rule as
bench_cuda's stack_layers: together at least 256 MB, at most 64); prints
RESULT lines."""
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def stack_layers(bytes_per_layer):
    return int(min(64, max(1, math.ceil(256e6 / bytes_per_layer))))


def graph_ms(layers, reps, layer):
    """Median per-layer time of `layers` calls captured into one CUDA graph."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(layers):  # warm-up outside the capture
            layer(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(layers):
            layer(i)
    return median_ms(g.replay, reps) / layers


def chunks():
    """--chunks: the query rows of a chunk of S new tokens over the T + S keys and values
    (bench_cuda --chunks' shapes), flash backend, one call between two events. Not causal:
    PyTorch's is_causal aligns the mask to the top left when S < T + S, so every row attends
    to all T + S keys here; the causal rows would skip at most S / 2 of them on average."""
    dev = torch.device("cuda")
    for B, Hkv, T in [(1, 8, 32768), (1, 8, 131072), (8, 8, 32768)]:
        for S in [16, 128, 512, 2048]:
            q = torch.randn(B, 32, S, 128, dtype=torch.float16, device=dev)
            k = torch.randn(B, Hkv, T + S, 128, dtype=torch.float16, device=dev)
            v = torch.randn_like(k)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 10)
            print(f"RESULT chunk kernel=torch_flash B={B} Hkv={Hkv} T={T} S={S} ms={ms:.5f}")
            sys.stdout.flush()
            del q, k, v
            torch.cuda.empty_cache()


def main():
    if "--chunks" in sys.argv:
        chunks()
        return
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    n = 4 << 30
    x = torch.empty(n // 2, dtype=torch.float16, device=dev).normal_()
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), 10)
    print(f"RESULT torch_copy gbs={2 * n / (ms * 1e-3) / 1e9:.1f}")
    del x, y
    Bs, Hs, Ts = [1, 8, 32], [32, 8], [4096, 32768, 131072, 524288]
    if quick:
        Bs, Ts = [1], [4096, 32768]
    for B in Bs:
        for Hkv in Hs:
            for T in Ts:
                if 2.0 * B * Hkv * T * 128 * 2 > 72e9:
                    continue
                nbytes = 2.0 * B * Hkv * T * 128 * 2
                L = stack_layers(nbytes)
                q = torch.randn(B, 32, 1, 128, dtype=torch.float16, device=dev)
                ks = [torch.randn(B, Hkv, T, 128, dtype=torch.float16, device=dev)]
                vs = [torch.randn(B, Hkv, T, 128, dtype=torch.float16, device=dev)]
                ks += [ks[0].clone() for _ in range(L - 1)]
                vs += [vs[0].clone() for _ in range(L - 1)]
                reps = 20 if T >= 131072 else 50
                gqa = Hkv != 32
                try:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        ms = median_ms(lambda: F.scaled_dot_product_attention(q, ks[0], vs[0], enable_gqa=gqa), reps)
                        outs = [None] * L

                        def layer(i):
                            outs[i] = F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=gqa)

                        gms = graph_ms(L, reps, layer)
                    print(f"RESULT decode kernel=torch_flash B={B} Hkv={Hkv} T={T} ms={ms:.5f} bytes={nbytes:.0f} graph_ms={gms:.5f} layers={L}")
                except RuntimeError as e:
                    print(f"RESULT decode kernel=torch_flash B={B} Hkv={Hkv} T={T} ms=nan bytes=0 graph_ms=nan layers={L} error={str(e)[:60]!r}")
                sys.stdout.flush()
                del q, ks, vs
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
