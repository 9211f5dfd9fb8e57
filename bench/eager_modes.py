"""Eager modes side by side: CPU eager, tpu strict, tpu defer_and_fuse.

Elementwise chains over 1M-16M elements (float32 unless --dtype):

* gelu_tanh:       0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out op by op
* bias_gelu_drop:  dropout(gelu(x + b, "tanh"), 0.1); defer_and_fuse draws the mask inside
                   the region (same numbers as strict mode) and fuses the rest
* resid_layernorm: h = x + r; (h - mean) * rsqrt(var + eps) * w + b, written elementwise
                   (mean and var as mean() over the last dimension, rows of 1024)

and (unless --no-demo) one training step of the demo's default model (torch_tpu.demo: a
byte-level GPT, bf16 autocast, forward + backward + gradient clipping + AdamW, as
bench/demo_step.py runs it).

Each figure is the median over --repeats of the time to issue one call and wait for it
(torch.tpu.synchronize(); the result is kept alive, as a caller would). HBM columns are the
cost model's bytes read + written per call (torch_tpu.runtime.stats()), in MB; "est us" is
the cost model's estimated device time per call on the slice's generation; "cpu-ms" is the
process's CPU time per call over all threads (the work done, less sensitive to other jobs on a
shared machine than wall time). Ratios: strict / defer (wall time and HBM bytes) and CPU / defer.

Run: python bench/eager_modes.py [--sizes 1M,4M,16M] [--repeats 5] [--dtype float32] [--no-demo] [--markdown]
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug
import torch_tpu.runtime

ROW = 1024


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def bias_gelu_drop(x, b):
    return F.dropout(F.gelu(x + b, approximate="tanh"), 0.1)


def resid_layernorm(x, r, w, b):
    h = x + r
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    return (h - mu) * torch.rsqrt(var + 1e-5) * w + b


def chains(n, dtype):
    rows = n // ROW

    def t(*shape):
        return torch.randn(*shape).to(dtype)
    return [
        ("gelu_tanh", gelu_tanh, lambda: (t(n),)),
        ("bias_gelu_drop", bias_gelu_drop, lambda: (t(rows, ROW), t(ROW))),
        ("resid_layernorm", resid_layernorm, lambda: (t(rows, ROW), t(rows, ROW), t(ROW), t(ROW))),
    ]


def demo_step(device):
    """(step function, its argument tuple) of the demo's default model on `device`."""
    from contextlib import nullcontext

    from torch_tpu.demo.loop import DEFAULTS
    from torch_tpu.estimate.models.gpt import GPT, PRESETS, GPTConfig, make_optimizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=DEFAULTS["seq_len"], **PRESETS[DEFAULTS["model_size"]])).to(device)
    opt = make_optimizer(model, 1e-3)
    g = torch.Generator().manual_seed(0)
    shape = (DEFAULTS["batch_size"], DEFAULTS["seq_len"])
    x = torch.randint(0, 256, shape, generator=g).to(device)
    y = torch.randint(0, 256, shape, generator=g).to(device)
    bf16 = DEFAULTS["dtype"] == "bf16"

    def step(x, y):
        with torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step, (x, y)


def time_calls(fn, args, repeats, sync):
    """Median wall seconds per call, and the process's CPU seconds per call (all threads)."""
    out = fn(*args)  # warm-up: compiles, fills the caching allocator
    sync()
    samples = []
    c0 = time.process_time()
    for _ in range(repeats):
        del out
        t0 = time.perf_counter()
        out = fn(*args)  # noqa: F841  (kept until the next call: freed outside the timed part)
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), (time.process_time() - c0) / repeats


def run_mode(mode, fn, args, repeats):
    torch_tpu.set_eager_mode(mode)
    try:
        sync = torch.tpu.synchronize
        time_calls(fn, args, 1, sync)  # warm-up outside the counters
        torch_tpu.runtime.reset_stats()
        seconds, cpu = time_calls(fn, args, repeats, sync)
        s = torch_tpu.runtime.stats()
        calls = repeats + 1
        hbm = (s["bytes_read"] + s["bytes_written"]) / calls
        est = s["device_seconds"] / calls
        return seconds, cpu, hbm, est
    finally:
        torch_tpu.set_eager_mode("strict")


def parse_sizes(text):
    out = []
    for item in text.split(","):
        item = item.strip().upper()
        mult = 1 << 20 if item.endswith("M") else (1 << 10 if item.endswith("K") else 1)
        out.append(int(float(item.rstrip("MK")) * mult))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-demo", action="store_true", help="skip the demo model's training step")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)

    header = ["chain", "elements", "CPU ms", "strict ms", "defer ms", "strict/defer", "CPU/defer",
              "strict cpu-ms", "defer cpu-ms", "strict HBM MB", "defer HBM MB", "HBM ratio",
              "strict est us", "defer est us"]
    rows = []
    torch_tpu.debug.reset_region_stats()
    for n in parse_sizes(args.sizes):
        for name, fn, make in chains(n, dtype):
            host = make()
            dev = [a.tpu() for a in host]
            torch.tpu.synchronize()
            cpu_s, _ = time_calls(fn, host, args.repeats, lambda: None)
            strict_s, strict_cpu, strict_hbm, strict_est = run_mode("strict", fn, dev, args.repeats)
            defer_s, defer_cpu, defer_hbm, defer_est = run_mode("defer_and_fuse", fn, dev, args.repeats)
            rows.append([name, f"{n / (1 << 20):g}M", f"{cpu_s * 1e3:.2f}", f"{strict_s * 1e3:.2f}",
                         f"{defer_s * 1e3:.2f}", f"{strict_s / defer_s:.2f}x", f"{cpu_s / defer_s:.2f}x",
                         f"{strict_cpu * 1e3:.1f}", f"{defer_cpu * 1e3:.1f}",
                         f"{strict_hbm / 1e6:.1f}", f"{defer_hbm / 1e6:.1f}", f"{strict_hbm / defer_hbm:.2f}x",
                         f"{strict_est * 1e6:.0f}", f"{defer_est * 1e6:.0f}"])
            print(" | ".join(rows[-1]) if not args.markdown else "", end="\n" if not args.markdown else "",
                  flush=True)
            del host, dev
    if not args.no_demo:
        fn, host = demo_step("cpu")
        cpu_s, _ = time_calls(fn, host, args.repeats, lambda: None)
        results = {}
        for mode in ("strict", "defer_and_fuse"):
            fn, dev = demo_step("tpu")
            results[mode] = run_mode(mode, fn, dev, args.repeats)
        (strict_s, strict_cpu, strict_hbm, strict_est), (defer_s, defer_cpu, defer_hbm, defer_est) = (
            results["strict"], results["defer_and_fuse"])
        rows.append(["demo_train_step", "-", f"{cpu_s * 1e3:.0f}", f"{strict_s * 1e3:.0f}", f"{defer_s * 1e3:.0f}",
                     f"{strict_s / defer_s:.2f}x", f"{cpu_s / defer_s:.2f}x", f"{strict_cpu * 1e3:.0f}",
                     f"{defer_cpu * 1e3:.0f}", f"{strict_hbm / 1e6:.1f}", f"{defer_hbm / 1e6:.1f}",
                     f"{strict_hbm / defer_hbm:.2f}x", f"{strict_est * 1e6:.0f}", f"{defer_est * 1e6:.0f}"])
        if not args.markdown:
            print(" | ".join(rows[-1]), flush=True)
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print()
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    s = torch_tpu.debug.region_stats()
    print(f"\ndefer_and_fuse regions: {s['regions_run']} run, {s['regions_compiled']} compiled, "
          f"{s['cache_hits']} cache hits, {s['ops_fused']} ops fused, "
          f"{s['hbm_bytes_avoided'] / 1e9:.2f} GB of intermediates never allocated")
    print(f"generation: {torch_tpu.runtime.stats()['generation']}; threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
