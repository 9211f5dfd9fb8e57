"""One training step of the demo's default model (torch_tpu.demo), on tpu against
CPU eager in the same process.

A step is forward + backward + gradient clipping + AdamW on one batch of the
demo's default shape, under the demo's default dtype (bf16 autocast). Each side
runs --warmup steps first, then --steps timed steps (tpu: each ends with
``loss.item()``, which waits for the chip); the figure is the median step time.
The last line is a JSON object with both medians (seconds) and the ratio tpu / cpu.

Run: python bench/demo_step.py [--steps 5] [--warmup 2] [--model-size small] [--dtype bf16]
"""

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch

import torch_tpu  # noqa: F401
from torch_tpu.demo.loop import DEFAULTS
from torch_tpu.estimate.models.gpt import GPT, PRESETS, GPTConfig, make_optimizer


def time_steps(device: str, args) -> list:
    """Seconds per step for ``args.steps`` steps after ``args.warmup`` untimed ones."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(seq_len=args.seq_len, **PRESETS[args.model_size])).to(device)
    opt = make_optimizer(model, 1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=g).to(device)
    y = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=g).to(device)
    amp = torch.autocast(device, dtype=torch.bfloat16) if args.dtype == "bf16" else nullcontext()
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        with amp:
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        if device == "tpu":
            torch.tpu.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--model-size", default=DEFAULTS["model_size"], choices=list(PRESETS))
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--seq-len", type=int, default=DEFAULTS["seq_len"])
    p.add_argument("--dtype", default=DEFAULTS["dtype"], choices=("bf16", "fp32"))
    args = p.parse_args()
    result = {"model_size": args.model_size, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "dtype": args.dtype, "threads": torch.get_num_threads()}
    for device in ("tpu", "cpu"):
        times = time_steps(device, args)
        result[f"{device}_step_s"] = statistics.median(times)
        print(f"{device}: median step {1e3 * result[f'{device}_step_s']:.1f} ms "
              f"(min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}, {len(times)} steps)")
    result["ratio_tpu_over_cpu"] = result["tpu_step_s"] / result["cpu_step_s"]
    print(f"ratio tpu / cpu: {result['ratio_tpu_over_cpu']:.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
