"""Greedy generation of a small random Llama on tpu (strict, defer_and_fuse) against CPU eager.

Model: transformers' LlamaForCausalLM from a LlamaConfig with 4 layers, hidden size 512,
8 heads (4 key/value heads), intermediate size 1408, vocabulary 32000, random weights (seed 0),
float32. ``generate`` with a static cache (``cache_implementation="static"``), greedy
(``do_sample=False``), batch 4, a 32-token prompt, exactly 64 new tokens.

Sides: ``cpu`` (CPU eager), ``tpu-strict`` and ``tpu-defer`` (``defer_and_fuse``), and
``tpu-hf-compile``. With a static cache on a ``tpu`` device transformers compiles the decode
step with ``torch.compile`` by itself (``GenerationMixin._valid_auto_compile_criteria`` lists
``tpu``; CPU stays eager): the eager sides pass ``disable_compile=True`` so that they measure
the eager mode they are named after; ``tpu-hf-compile`` is transformers' default on tpu (the
decode step compiled, strict mode around it). Each side
runs in its own child process (the CPU side with TORCH_DEVICE_BACKEND_AUTOLOAD=0, never loading
torch_tpu: in one process the stream worker's OpenMP team and the main thread's would make
libgomp stop spinning and slow both sides, docs/limits.md), runs --warmup generations, then
--repeats timed ones; the figure is the median tokens/s (batch x new tokens / seconds, a
generation ends with its tokens on the host). The sides alternate within each repeat, so that
load from other jobs falls on all of them alike. The generated tokens of every tpu side are
passed back and checked equal to CPU's. Peak RSS and HBM are each side's process's.

Needs the ``hf`` extra (transformers). Run:
    python bench/generate.py [--repeats 3] [--warmup 1] [--new-tokens 64] [--markdown]
The last line is a JSON object with every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

SIDES = ("cpu", "tpu-strict", "tpu-defer", "tpu-hf-compile")
SETUP = {  # side: (device, tpu eager mode, let transformers compile the decode step)
    "cpu": ("cpu", None, False),
    "tpu-strict": ("tpu", "strict", False),
    "tpu-defer": ("tpu", "defer_and_fuse", False),
    "tpu-hf-compile": ("tpu", "strict", True),
}


def _without_broken_media_packages():
    """A torchvision or torchaudio built for another torch fails at import; transformers would
    import them for its image and audio utilities (not used here): tell transformers they are absent."""
    import importlib

    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    for pkg, checks in (
        ("torchvision", ("is_torchvision_available",)),
        ("torchaudio", ("is_torchaudio_available", "is_speech_available")),
    ):
        try:
            importlib.import_module(pkg)
        except Exception:  # noqa: BLE001
            for m in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
                sys.modules.pop(m)
            for c in checks:
                setattr(iu, c, lambda: False)
                setattr(tu, c, lambda: False)


def build(device):
    # Run as a script, bench/ is sys.path[0]: transformers would take bench/kernels.py for the
    # Hugging Face `kernels` package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    _without_broken_media_packages()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().to(device)


def generate(model, ids, new_tokens, mode, hf_compile=False):
    """Greedy tokens [batch, prompt + new_tokens] on the host. ``mode``: the tpu eager mode (None on
    CPU); ``hf_compile``: let transformers compile the decode step (its default on tpu)."""
    if mode:
        import torch_tpu

        ctx = torch_tpu.eager_mode(mode)
    else:
        ctx = torch.no_grad()
    with torch.no_grad(), ctx:
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
            disable_compile=not hf_compile,
        )
        return out.cpu()


CHILD = "--child"  # child mode: one side; reads "run" lines, answers one JSON line per generation


def serve_side(side, args):
    """One side in its own process (the CPU side never loads torch_tpu): answers each "run" line
    with the generation's wall and CPU seconds and its tokens, "quit" with its peak memory."""
    if side != "cpu":
        import torch_tpu  # noqa: F401  (not in the CPU side: its OpenMP team would slow both)
    dev, mode, hf_compile = SETUP[side]
    g = torch.Generator().manual_seed(0)
    ids_cpu = torch.randint(0, 32000, (args.batch, args.prompt), generator=g)
    model = build(dev)
    for line in sys.stdin:
        if line.strip() == "quit":
            peak = {"peak_rss_mb": _peak_rss_mb()}
            if dev == "tpu":
                peak["peak_hbm_mb"] = torch.tpu.max_memory_allocated() / 2**20
            print(json.dumps(peak), flush=True)
            return
        ids = ids_cpu.to(dev)
        t0, c0 = time.perf_counter(), time.process_time()
        out = generate(model, ids, args.new_tokens, mode, hf_compile)
        dt, cpu_dt = time.perf_counter() - t0, time.process_time() - c0
        print(json.dumps({"s": dt, "cpu_s": cpu_dt, "tokens": out.tolist()}), flush=True)


class Side:
    """A side's child process (the CPU side with TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""

    def __init__(self, side, argv):
        env = os.environ.copy()
        if side == "cpu":
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        self.child = subprocess.Popen(
            [sys.executable, __file__, CHILD, side] + argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, line):
        self.child.stdin.write(line + "\n")
        self.child.stdin.flush()
        answer = self.child.stdout.readline()
        if not answer:
            raise RuntimeError(f"bench/generate.py: a side's child process ended (exit status {self.child.wait()})")
        return json.loads(answer)

    def close(self):
        peak = self.ask("quit")
        self.child.wait()
        return peak


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--markdown", action="store_true")
    return p


def main():
    args = parser().parse_args()
    sides = args.sides.split(",")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    argv = ["--batch", str(args.batch), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens)]
    children = {s: Side(s, argv) for s in sides}
    ref = None
    times = {s: [] for s in sides}
    cpu_times = {s: [] for s in sides}  # the process's CPU seconds (all threads): less disturbed by other jobs
    for rep in range(args.warmup + args.repeats):
        for s in sides:
            got = children[s].ask("run")
            out = got["tokens"]
            if ref is None and s == "cpu":
                ref = out
            if ref is not None and out != ref:
                differ = sum(a != b for ra, rb in zip(out, ref) for a, b in zip(ra, rb))
                print(
                    f"warning: {s} generated other tokens than cpu ({differ} of {len(ref) * len(ref[0])} differ)",
                    file=sys.stderr,
                )
            if rep >= args.warmup:
                times[s].append(got["s"])
                cpu_times[s].append(got["cpu_s"])
    peaks = {s: children[s].close() for s in sides}
    tokens = args.batch * args.new_tokens
    res = {
        s: {
            "median_s": statistics.median(t),
            "tokens_per_s": tokens / statistics.median(t),
            "times_s": t,
            "median_cpu_s": statistics.median(cpu_times[s]),
        }
        | peaks[s]
        for s, t in times.items()
    }
    for s in list(res):
        if "cpu" in res:
            res[s]["vs_cpu"] = res[s]["tokens_per_s"] / res["cpu"]["tokens_per_s"]
            res[s]["cpu_s_vs_cpu"] = res["cpu"]["median_cpu_s"] / res[s]["median_cpu_s"]
    res["peak_rss_mb"] = max(p["peak_rss_mb"] for p in peaks.values())
    hbm = [p["peak_hbm_mb"] for p in peaks.values() if "peak_hbm_mb" in p]
    if hbm:
        res["peak_hbm_mb"] = max(hbm)
    cols = ["side", "tokens/s", "median s", "vs cpu", "cpu-s", "cpu-s vs cpu"]
    rows = [
        [
            s,
            f"{res[s]['tokens_per_s']:.1f}",
            f"{res[s]['median_s']:.2f}",
            f"{res[s].get('vs_cpu', float('nan')):.2f}x",
            f"{res[s]['median_cpu_s']:.2f}",
            f"{res[s].get('cpu_s_vs_cpu', float('nan')):.2f}x",
        ]
        for s in sides
    ]
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [cols] + rows:
            print("  ".join(v.ljust(12) for v in r))
    print(json.dumps(res))


def _peak_rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        serve_side(sys.argv[2], parser().parse_args(sys.argv[3:]))
    else:
        main()
