#!/usr/bin/env python3
"""PyTorch reference for bench/attention_benchmark: causal GQA attention, bf16, the same shapes,
through torch.nn.functional.scaled_dot_product_attention on its cuDNN and FlashAttention-2
backends (enable_gqa=True). Same FLOP count and timing rule (median of --iters after --warmup,
CUDA events; backward = forward+backward minus forward)."""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(2, 4096, 12, 4, 128), (4, 4096, 12, 4, 128), (1, 4096, 16, 16, 128),
          (2, 4096, 16, 4, 128), (1, 8192, 8, 8, 128), (4, 2048, 16, 16, 64)]


def median_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name(0)}")
    print(f"{'backend':<10} {'B':>3} {'S':>6} {'Hq':>4} {'Hkv':>4} {'D':>4} {'fwd ms':>10} "
          f"{'fwd TF/s':>10} {'bwd ms':>10} {'bwd TF/s':>10}")
    for b, s, hq, hkv, d in SHAPES:
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * 2.0 * b * hq * (s * s / 2) * d
        for name, be in (("torch-cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("torch-fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([be]):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 enable_gqa=hq != hkv)
                    f_ms = median_ms(fwd, args.warmup, args.iters)
                    both = lambda: torch.autograd.grad(fwd(), (q, k, v), do)
                    fb_ms = median_ms(both, args.warmup, args.iters)
                b_ms = fb_ms - f_ms
                print(f"{name:<10} {b:>3} {s:>6} {hq:>4} {hkv:>4} {d:>4} {f_ms:>10.3f} "
                      f"{flops / f_ms / 1e9:>10.0f} {b_ms:>10.3f} {2.5 * flops / b_ms / 1e9:>10.0f}")
            except Exception as e:  # a backend that cannot run this shape
                print(f"{name:<10} {b:>3} {s:>6} {hq:>4} {hkv:>4} {d:>4} failed: {e}"[:200])


if __name__ == "__main__":
    main()
