"""torch.compile(backend="tpu") against inductor on CPU and CPU eager, side by side.

Workloads (same shapes, dtypes and seeds on every side):

* ``gpt_train_step``: one training step of the demo's GPT (torch_tpu.demo, default
  ``small`` model, batch 16 x 128, bf16 autocast): forward, backward, gradient
  clipping, AdamW. Compiled sides compile the model and ``opt.step`` (lr a tensor).
* ``mlp_block``: forward + backward of a transformer MLP block in float32,
  ``x + fc2(gelu(fc1(layer_norm(x))))`` on [1024, 512] with hidden size 2048.

Sides: ``tpu-compile`` (torch.compile(backend="tpu") on the vTPU), ``tpu-strict``
(eager on the vTPU), ``cpu-inductor`` (torch.compile, inductor, on CPU tensors) and
``cpu-eager``; on request (--sides) ``tpu-compile-copies``, tpu-compile with region results
copied back into parameters and optimizer state instead of written in place (the program
cache off for it); ``tpu-compile-scalar-calls`` (0-dim CPU chains as library calls: the
scalars step off) likewise.
Every side runs in its own child process (the CPU sides with TORCH_DEVICE_BACKEND_AUTOLOAD=0,
never loading torch_tpu; the tpu sides' inputs made on the chip): in one process, the main
thread's OpenMP team (inductor's and CPU eager's kernels) and the chip worker's would make
libgomp stop spinning and slow every parallel kernel of both (docs/limits.md). Each side runs
--warmup calls (the first compiles); then --steps rounds time one call of every side in turn
(interleaved, so that other jobs' load falls on all alike; each call starts 20 ms after the
previous side's, once that side's idle OpenMP threads stopped spinning); the figure is each
side's median (tpu calls end with a synchronize), and the median process CPU seconds of a call
(all threads; steadier than wall time on a loaded machine). Peak RSS is the side's own process's.
The sides' first-call losses are compared (``loss max diff``; bf16 autocast: a few 1e-3 apart). Compile seconds:
the first call's time minus a steady call's (Dynamo and AOTAutograd tracing included);
in parentheses the backend's own part (``compile_stats()["compile_seconds"]``: lowering,
fusion, planning, or loading). ``warm`` repeats tpu's compilation in the same process
with Dynamo reset and the in-memory program cache cleared, so the programs come from
the disk cache (TORCH_TPU_CACHE_DIR, a fresh temporary folder). Inductor compiles cold
(a fresh TORCHINDUCTOR_CACHE_DIR) unless --warm-inductor.

Run: python bench/compile.py [--steps 5] [--warmup 2] [--workloads gpt_train_step,mlp_block]
     [--sides tpu-compile,tpu-strict,cpu-inductor,cpu-eager] [--markdown]
The last line is a JSON object with every figure.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

CHILD = "--side-child"  # child mode: one side of one workload, driven through stdin / stdout


def sync(device):
    if device == "tpu":
        torch.tpu.synchronize()


# ------------------------------------------------------------------ workloads


def _gpt_module():
    """torch_tpu/estimate/models/gpt.py loaded by path: the CPU sides never import torch_tpu."""
    import importlib.util

    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_tpu", "estimate", "models", "gpt.py"
    )
    spec = importlib.util.spec_from_file_location("bench_gpt", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpt"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def _on(device, module, state):
    """`module` (built on the meta device) on `device` with the CPU tensors of `state` copied in:
    the tpu sides run no CPU kernel of their own on the main thread (no second OpenMP team)."""
    module = module.to_empty(device=device)
    module.load_state_dict(state)
    return module


def gpt_init(args):
    """CPU weights and batch of the training step (built once, in the parent process)."""
    gpt = _gpt_module()
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(seq_len=args.seq_len, **gpt.PRESETS[args.model_size]))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=g)
    y = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=g)
    return {"model": model.state_dict(), "x": x, "y": y}


def gpt_setup(device, compiled, backend, args, init):
    gpt = _gpt_module()
    with torch.device("meta"):
        model = gpt.GPT(gpt.GPTConfig(seq_len=args.seq_len, **gpt.PRESETS[args.model_size]))
    model = _on(device, model, init["model"])
    opt = gpt.make_optimizer(model, 1e-3)
    fwd, step = model, opt.step
    if compiled:
        for g in opt.param_groups:
            g["lr"] = torch.tensor(1e-3)
        fwd = torch.compile(model, backend=backend)
        step = torch.compile(opt.step, backend=backend)
    x, y = init["x"].to(device), init["y"].to(device)
    amp = torch.autocast(device, dtype=torch.bfloat16) if args.dtype == "bf16" else nullcontext()

    def call():
        with amp:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return call


class MLPBlock(nn.Module):
    def __init__(self, d=512, h=2048):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


def mlp_init(args):
    torch.manual_seed(0)
    return {"block": MLPBlock().state_dict(), "x": torch.randn(1024, 512)}


def mlp_setup(device, compiled, backend, args, init):
    with torch.device("meta"):
        block = MLPBlock()
    block = _on(device, block, init["block"])
    fwd = torch.compile(block, backend=backend) if compiled else block
    x = init["x"].to(device).requires_grad_()

    def call():
        out = fwd(x)
        loss = out.square().mean()
        loss.backward()
        block.zero_grad(set_to_none=True)
        x.grad = None
        return loss.item()

    return call


WORKLOADS = {"gpt_train_step": gpt_setup, "mlp_block": mlp_setup}
INITS = {"gpt_train_step": gpt_init, "mlp_block": mlp_init}
SIDES = {
    "tpu-compile": ("tpu", True, "tpu"),
    "tpu-strict": ("tpu", False, None),
    "cpu-inductor": ("cpu", True, "inductor"),
    "cpu-eager": ("cpu", False, None),
    # tpu-compile with the in-place rule off (results copied back, as before it): --sides to add it
    "tpu-compile-copies": ("tpu", True, "tpu"),
    # tpu-compile with 0-dim CPU chains as library calls (the scalars step off): --sides to add it
    "tpu-compile-scalar-calls": ("tpu", True, "tpu"),
}
DEFAULT_SIDES = ("tpu-compile", "tpu-strict", "cpu-inductor", "cpu-eager")


def _patched(side):
    """(module, attribute, replacement) that turns a rule off for a comparison side."""
    if side not in ("tpu-compile-copies", "tpu-compile-scalar-calls"):
        return None
    from torch_tpu.compile import builder, host_scalars

    return {
        # region results copied back into parameters and optimizer state, as before the in-place rule
        "tpu-compile-copies": (builder, "_write_in_place", lambda steps, step_nodes, *a: (steps, step_nodes)),
        "tpu-compile-scalar-calls": (host_scalars, "find", lambda body, outs: ([], [])),
    }.get(side)


def _without_rule(side, compile_fn):
    """Run `compile_fn` with `side`'s rule off and the program cache off, so that no program
    built with the rule is reused (and none built without it is kept)."""
    from torch_tpu.compile import cache as program_cache

    mod, name, repl = _patched(side)
    saved, env = getattr(mod, name), os.environ.get("TORCH_TPU_CACHE_DIR")
    setattr(mod, name, repl)
    os.environ["TORCH_TPU_CACHE_DIR"] = ""
    program_cache.clear_memory_cache()
    try:
        return compile_fn()
    finally:
        setattr(mod, name, saved)
        os.environ["TORCH_TPU_CACHE_DIR"] = env
        program_cache.clear_memory_cache()


def _compile_stats():
    import torch_tpu

    return torch_tpu.compile_stats()


def prepare(workload, side, args, init):
    """Set `side` up and run its first (compiling) and warm-up calls: (call, partial result)."""
    device, compiled, backend = SIDES[side]
    stats0 = _compile_stats() if device == "tpu" else None
    call = WORKLOADS[workload](device, compiled, backend, args, init)
    losses = []

    def first_calls():
        t0 = time.perf_counter()
        losses.append(call())
        sync(device)
        first = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            losses.append(call())
        sync(device)
        return first

    first = _without_rule(side, first_calls) if _patched(side) else first_calls()
    res = {"first_call_s": first, "first_loss": losses[0]}
    if side == "tpu-compile":
        res["cold_backend_s"] = _compile_stats()["compile_seconds"] - stats0["compile_seconds"]
    return call, res


def finish(workload, side, args, init, res, times):
    """Medians and compile seconds of `side`; tpu-compile's warm compile (Dynamo reset: run last)."""
    device, compiled, backend = SIDES[side]
    med = statistics.median(times)
    res["median_s"] = med
    if compiled:
        res["compile_s"] = max(res["first_call_s"] - med, 0.0)
    if side == "tpu-compile":
        from torch_tpu.compile import cache as program_cache

        res["cold_compile_s"] = res.pop("compile_s")
        # warm: the same graphs compiled again, programs from the disk cache
        torch._dynamo.reset()
        program_cache.clear_memory_cache()
        before = _compile_stats()
        call = WORKLOADS[workload](device, compiled, backend, args, init)
        t0 = time.perf_counter()
        call()
        sync(device)
        res["warm_compile_s"] = max(time.perf_counter() - t0 - med, 0.0)
        after = _compile_stats()
        res["warm_disk_hits"] = after["cache_hits_disk"] - before["cache_hits_disk"]
        res["warm_compilations"] = after["compilations"] - before["compilations"]
        res["warm_backend_s"] = after["compile_seconds"] - before["compile_seconds"]
        res["regions"] = after["regions"] - before["regions"]
    return res


def serve_side(workload, side, init_path):
    """Child process of one side: `prepare` on start, then one timed call per "step" line, and
    the side's results (JSON) on "finish"."""
    args = argparse.Namespace(**json.loads(os.environ["TORCH_TPU_BENCH_ARGS"]))
    init = torch.load(init_path)
    device = SIDES[side][0]
    if device == "tpu":
        import torch_tpu  # noqa: F401  (registers the device when autoload is off)
    call, res = prepare(workload, side, args, init)
    print(json.dumps({"ready": True}), flush=True)
    times, cpu_times = [], []
    for line in sys.stdin:
        if line.strip() == "finish":
            break
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        sync(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        print("{}", flush=True)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["median_cpu_s"] = statistics.median(cpu_times)
    finish(workload, side, args, init, res, times)
    print(json.dumps(res), flush=True)


class Side:
    """One side of a workload in its own process (CPU sides: TORCH_DEVICE_BACKEND_AUTOLOAD=0)."""

    def __init__(self, workload, side, init_path, args):
        env = os.environ | {"TORCH_TPU_BENCH_ARGS": json.dumps(vars(args))}
        if SIDES[side][0] == "cpu":
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        self.child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), CHILD, workload, side, init_path],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answer()  # set up, compiled, warmed up

    def _answer(self):
        line = self.child.stdout.readline()
        if not line:
            raise RuntimeError(f"side process exited with {self.child.wait()}")
        return json.loads(line)

    def step(self):
        time.sleep(0.02)  # the previous side's idle OpenMP threads stop spinning (libgomp spins ~3 ms)
        self.child.stdin.write("step\n")
        self.child.stdin.flush()
        self._answer()

    def finish(self):
        self.child.stdin.write("finish\n")
        self.child.stdin.flush()
        res = self._answer()
        self.child.wait()
        return res


def measure_workload(workload, sides, args):
    """Every side set up and warmed in its own process (one after the other), then timed calls
    interleaved (side after side, --steps rounds), so that load from other jobs falls on all
    sides alike."""
    init_path = os.path.join(tempfile.mkdtemp(prefix="torch_tpu_bench_init_"), "init.pt")
    torch.save(INITS[workload](args), init_path)
    procs = {side: Side(workload, side, init_path, args) for side in sides}
    for _ in range(args.steps):
        for side in sides:
            procs[side].step()
    results = {side: procs[side].finish() for side in sides}
    losses = [r["first_loss"] for r in results.values()]
    for r in results.values():
        r["loss_max_diff"] = max(losses) - min(losses)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES))
    p.add_argument("--model-size", default="small")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--warm-inductor",
        action="store_true",
        help="keep inductor's on-disk caches (default: a fresh TORCHINDUCTOR_CACHE_DIR, a cold compile)",
    )
    args = p.parse_args()
    os.environ["TORCH_TPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_tpu_bench_cache_")
    if not args.warm_inductor:  # inductor's own on-disk caches would make its compile a lookup
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="torch_tpu_bench_inductor_")

    results = {}
    for w in args.workloads.split(","):
        results[w] = measure_workload(w, args.sides.split(","), args)
        for side in args.sides.split(","):
            print(
                f"{w:16s} {side:13s} "
                + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in results[w][side].items()),
                file=sys.stderr,
                flush=True,
            )

    cols = [
        "workload",
        "tpu-compile ms",
        "tpu-strict ms",
        "cpu-inductor ms",
        "cpu-eager ms",
        "inductor / tpu-compile",
        "cpu-eager / tpu-compile",
        "tpu-strict / tpu-compile",
        "tpu compile s cold / warm (backend part)",
        "inductor compile s",
        "copy-back / tpu-compile",
        "scalar-calls / tpu-compile",
        "CPU s per call: compile / strict / inductor (strict / compile, inductor / compile)",
        "first loss max diff between sides",
    ]
    rows = []

    def cpu_cell(r):
        def c(side):
            return r[side]["median_cpu_s"] if side in r else float("nan")

        tc, ts, ti = c("tpu-compile"), c("tpu-strict"), c("cpu-inductor")
        return f"{tc:.3f} / {ts:.3f} / {ti:.3f} ({ts / tc:.2f}x, {ti / tc:.2f}x)"

    for w, r in results.items():

        def ms(side, r=r):
            return r[side]["median_s"] * 1e3 if side in r else float("nan")

        def ratio(a, b, r=r):
            return ms(a) / ms(b) if a in r and b in r else float("nan")

        tc = r.get("tpu-compile", {})
        rows.append(
            [
                w,
                f"{ms('tpu-compile'):.1f}",
                f"{ms('tpu-strict'):.1f}",
                f"{ms('cpu-inductor'):.1f}",
                f"{ms('cpu-eager'):.1f}",
                f"{ratio('cpu-inductor', 'tpu-compile'):.2f}x",
                f"{ratio('cpu-eager', 'tpu-compile'):.2f}x",
                f"{ratio('tpu-strict', 'tpu-compile'):.2f}x",
                f"{tc.get('cold_compile_s', float('nan')):.1f} ({tc.get('cold_backend_s', float('nan')):.2f}) / "
                f"{tc.get('warm_compile_s', float('nan')):.1f} ({tc.get('warm_backend_s', float('nan')):.2f})",
                f"{r.get('cpu-inductor', {}).get('compile_s', float('nan')):.2f}",
                f"{ratio('tpu-compile-copies', 'tpu-compile'):.2f}x",
                f"{ratio('tpu-compile-scalar-calls', 'tpu-compile'):.2f}x",
                cpu_cell(r),
                f"{next(iter(r.values()))['loss_max_diff']:.2g}",
            ]
        )
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        print("  ".join(c.ljust(wd) for c, wd in zip(cols, widths)))
        for row in rows:
            print("  ".join(v.ljust(wd) for v, wd in zip(row, widths)))
    print(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == CHILD:
        serve_side(*sys.argv[2:])
    else:
        main()
