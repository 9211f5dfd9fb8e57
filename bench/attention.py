"""Attention benchmark: torch.tpu.ops.splash_sdpa and F.scaled_dot_product_attention on tpu against
today's math path on tpu (SDPA forced to the math backend with torch.nn.attention.sdpa_kernel) and
against CPU eager SDPA, causal, forward + backward, in the same process.

Each time is the median over `--repeats` calls (after one warm-up) of forward, backward and a
torch.tpu.synchronize(), the variants taking turns within each repeat; "peak" is the allocator's
peak physical HBM bytes above the inputs during the warm-up call (torch.tpu.max_memory_allocated).
Ratios: math / splash and math / sdpa (above 1: the blocked kernel is faster), splash / cpu. The
math path is skipped above `--math-max-t` (its T x T buffers: 4 of them in float32 per head at
least).

Run: python bench/attention.py [--t 512,1024,2048,4096,8192] [--dtypes float32,bfloat16]
                               [--heads 2] [--dim 64] [--repeats 3] [--math-max-t 4096]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_tpu  # noqa: F401
import torch_tpu.tpu.ops as ops

DEV = "tpu"


def _step(kind: str, q, k, v) -> None:
    if kind == "splash":
        out = ops.splash_sdpa(q, k, v, is_causal=True)
    elif kind == "math":
        with sdpa_kernel([SDPBackend.MATH]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # "sdpa" on tpu, or CPU eager
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(torch.ones_like(out))
    q.grad = k.grad = v.grad = None


def measure(kinds, T: int, dtype: torch.dtype, heads: int, dim: int, repeats: int) -> dict:
    """{kind: (median seconds per forward + backward, peak HBM bytes above the inputs; 0 on CPU)}.

    The kinds take turns within each repeat, so a change in the machine's load hits them alike."""
    g = torch.Generator().manual_seed(T)
    host = [torch.randn(1, heads, T, dim, generator=g) for _ in range(3)]
    inputs = {kind: [t.to("cpu" if kind == "cpu" else DEV, dtype).requires_grad_(True) for t in host]
              for kind in kinds}

    def sync():
        torch.tpu.synchronize()

    samples = {kind: [] for kind in kinds}
    peaks = dict.fromkeys(kinds, 0)
    for kind in kinds:  # warm-up, and the peak of one call
        sync()
        base = torch.tpu.memory_allocated()
        torch.tpu.reset_peak_memory_stats()
        _step(kind, *inputs[kind])
        sync()
        if kind != "cpu":
            peaks[kind] = torch.tpu.max_memory_allocated() - base
    for _ in range(repeats):
        for kind in kinds:
            t0 = time.perf_counter()
            _step(kind, *inputs[kind])
            sync()
            samples[kind].append(time.perf_counter() - t0)
    return {kind: (statistics.median(samples[kind]), peaks[kind]) for kind in kinds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--t", default="512,1024,2048,4096,8192", help="sequence lengths")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--math-max-t", type=int, default=4096, help="skip the math path above this length")
    args = p.parse_args()
    print(f"causal attention, B=1, H={args.heads}, D={args.dim}, forward + backward; median of {args.repeats}")
    print("| dtype | T | splash ms | sdpa ms | math ms | cpu ms | peak MiB splash / sdpa / math "
          "| math/splash | math/sdpa | splash/cpu |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for T in (int(t) for t in args.t.split(",")):
            kinds = ("splash", "sdpa", "cpu") + (("math",) if T <= args.math_max_t else ())
            r = measure(kinds, T, dtype, args.heads, args.dim, args.repeats)
            r.setdefault("math", (float("nan"), 0))
            ms = {k: v[0] * 1e3 for k, v in r.items()}
            mib = {k: v[1] / 2**20 for k, v in r.items()}
            math_peak = f"{mib['math']:.1f}" if T <= args.math_max_t else "-"
            print(f"| {name} | {T} | {ms['splash']:.1f} | {ms['sdpa']:.1f} | {ms['math']:.1f} | {ms['cpu']:.1f} "
                  f"| {mib['splash']:.1f} / {mib['sdpa']:.1f} / {math_peak} | {ms['math'] / ms['splash']:.2f} "
                  f"| {ms['math'] / ms['sdpa']:.2f} | {ms['splash'] / ms['cpu']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
