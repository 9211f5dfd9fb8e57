"""Our tile executor vs XLA:CPU (jaxlib) on the same compiled programs, same process.

Workloads: the eager-mode chains (tanh-GELU, residual + layer norm) at several sizes and an MLP
training-step-sized forward, each compiled with torch.compile(backend="tpu") once per executor
(TORCH_TPU_EXECUTOR=tile / xla). Prints time per call (median of --reps), the first call's
seconds (compile + run), and the ratio tile / xla (> 1: XLA faster).

    PYTHONPATH=. python bench/executors.py [--sizes 1M,4M] [--reps 10]
"""

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import torch_tpu  # noqa: F401


def gelu_chain(x):
    return F.gelu(x, approximate="tanh") * 1.5 + x


def residual_layer_norm(x, r):
    return F.layer_norm(x + r, x.shape[-1:])


def mlp(x, w1, w2):
    return torch.log_softmax(F.gelu(x @ w1) @ w2, dim=-1)


def _sync(t):
    t.cpu()


def measure(fn, args, executor: str, reps: int):
    os.environ["TORCH_TPU_EXECUTOR"] = executor
    torch._dynamo.reset()
    from torch_tpu.compile import cache

    cache.clear_memory_cache()
    f = torch.compile(fn, backend="tpu", dynamic=False)
    t0 = time.perf_counter()
    _sync(f(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _sync(f(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M,4M")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")
    sizes = [int(float(s[:-1]) * (1 << 20)) if s.endswith("M") else int(s) for s in a.sizes.split(",")]
    work = []
    for n in sizes:
        rows = n // 1024
        work.append((f"gelu chain {n >> 20}M", gelu_chain, [torch.randn(rows, 1024).tpu()]))
        work.append((f"residual+layer norm {n >> 20}M", residual_layer_norm,
                     [torch.randn(rows, 1024).tpu(), torch.randn(rows, 1024).tpu()]))
    work.append(("mlp 256x512x512x64", mlp, [torch.randn(256, 512).tpu(), torch.randn(512, 512).tpu(),
                                            torch.randn(512, 64).tpu()]))
    print(f"{'workload':32s} {'tile ms':>9s} {'xla ms':>9s} {'tile/xla':>9s} {'tile 1st s':>11s} {'xla 1st s':>10s}")
    for name, fn, args in work:
        t_ours, c_ours = measure(fn, args, "tile", a.reps)
        t_xla, c_xla = measure(fn, args, "xla", a.reps)
        print(f"{name:32s} {t_ours * 1e3:9.2f} {t_xla * 1e3:9.2f} {t_ours / t_xla:9.2f} {c_ours:11.2f} {c_xla:10.2f}")
    s = torch_tpu.compile_stats()
    print("xla programs run:", s["xla_programs"], "fallbacks:", s["xla_fallbacks"])


if __name__ == "__main__":
    main()
