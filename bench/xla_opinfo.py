"""The OpInfo float32 forward shard through torch.compile(backend="tpu") on both executors
(TORCH_TPU_EXECUTOR=tile and xla), each against CPU PyTorch with OpInfo's tolerances.

Reports, per executor, cases passed / mismatched / failed to compile, and for xla how many
programs XLA ran and how many fell back to ours (with the ops that stayed custom calls).
A script rather than a test: the full shard takes minutes.

    PYTHONPATH=.:tests/python python bench/xla_opinfo.py [--ops N] [--samples 2]
"""

import argparse
import collections
import os
import time

import torch

import torch_tpu
from helpers import opinfo_harness as H


def run(executor: str, names, samples: int):
    os.environ["TORCH_TPU_EXECUTOR"] = executor
    torch_tpu.reset_compile_stats()
    counts = collections.Counter()
    bad = []
    for name in names:
        op = H.OPS[name]
        if H.applicable(op, "float32", "forward") is not None or H.is_random(op) or name in H.UNINIT_OPS:
            continue
        try:
            ss = list(op.sample_inputs("cpu", torch.float32))[:samples]
        except Exception:  # noqa: BLE001
            continue
        for s in ss:
            torch._dynamo.reset()
            try:
                want = op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001
                continue
            d = H.copy_sample(s, "tpu", name)
            try:
                f = torch.compile(lambda x, *a, op=op, **k: op(x, *a, **k), backend="tpu", dynamic=False)
                got = f(d.input, *d.args, **d.kwargs)
            except Exception as e:  # noqa: BLE001
                counts["error"] += 1
                bad.append((name, f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"))
                continue
            rtol, atol, _ = H.tolerance(op, "float32", "forward")
            try:
                H.compare(got, want, rtol, atol)
                counts["passed"] += 1
            except Exception as e:  # noqa: BLE001
                counts["mismatch"] += 1
                bad.append((name, str(e).splitlines()[0][:120]))
    s = torch_tpu.compile_stats()
    return counts, bad, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=0, help="first N ops of the OpInfo db (0: all)")
    ap.add_argument("--samples", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("TORCH_TPU_CACHE_DIR", "")
    names = sorted(H.OPS)[: a.ops or None]
    for ex in ("tile", "xla"):
        t0 = time.perf_counter()
        counts, bad, s = run(ex, names, a.samples)
        print(f"{ex}: {dict(counts)} in {time.perf_counter() - t0:.0f} s; xla programs {s['xla_programs']}, "
              f"fallbacks {len(s['xla_fallbacks'])}, custom calls {dict(s['custom_calls'])}")
        for n, why in bad[:40]:
            print(f"  {n}: {why}")


if __name__ == "__main__":
    main()
