"""PyTorch fp16 decode attention (scaled_dot_product_attention, flash backend)
on the shapes of bench_cuda, timed with CUDA events; prints RESULT lines."""
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


def main():
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
                q = torch.randn(B, 32, 1, 128, dtype=torch.float16, device=dev)
                k = torch.randn(B, Hkv, T, 128, dtype=torch.float16, device=dev)
                v = torch.randn(B, Hkv, T, 128, dtype=torch.float16, device=dev)
                reps = 20 if T >= 131072 else 50
                try:
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=(Hkv != 32)), reps)
                    print(f"RESULT decode kernel=torch_flash B={B} Hkv={Hkv} T={T} ms={ms:.5f} bytes={2.0 * B * Hkv * T * 128 * 2:.0f}")
                except RuntimeError as e:
                    print(f"RESULT decode kernel=torch_flash B={B} Hkv={Hkv} T={T} ms=nan bytes=0 error={str(e)[:60]!r}")
                sys.stdout.flush()
                del q, k, v
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
