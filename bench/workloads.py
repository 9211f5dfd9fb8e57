"""Small whole workloads, tpu strict against CPU eager: where ops.py and op_sweep.py time one op,
these time the steps users run (a training step with its optimizer, an inference call), so that
costs between the ops (an optimizer's Python and scalars, recurrent cells, module fast paths)
show up.

Workloads (float32, seeds fixed, the same on both sides):

* ``cnn_sgd``: 5 conv-BatchNorm-ReLU blocks on [32, 3, 32, 32], cross entropy, SGD with momentum.
* ``mlp_adamw``: a 64-128-128-10 MLP on 64 rows, cross entropy, AdamW (default: foreach on tpu,
  a loop on CPU; new step sizes every step).
* ``lstm_adam``: a 2-layer LSTM (128 -> 256) over [16, 64, 128], a linear head, Adam.
* ``gru_adam``: the same with a GRU.
* ``encoder_adamw``: a 4-layer nn.TransformerEncoder (d 256, 4 heads, ff 1024) on [8, 128, 256],
  AdamW.
* ``encoder_infer``: the same encoder in eval mode under inference_mode (its fused fast path).

Each side runs in its own child process (CPU eager without loading torch_tpu: one process's two
OpenMP teams would slow both, docs/limits.md). A round starts each side's child in turn; a child
runs --warmup steps, then --steps steps, each ending in ``loss.item()``, and answers the median
step time. The figure per side is the median over --rounds rounds; the last column is tpu / cpu.

Run: python bench/workloads.py [--rounds 3] [--steps 20] [--warmup 3] [--workloads cnn_sgd,...]
The last line is a JSON object with every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = "--child"


def build(name: str, dev: str):
    """The workload's step function on device `dev`."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "cnn_sgd":

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

        model = nn.Sequential(
            block(3, 32),
            block(32, 32),
            nn.MaxPool2d(2),
            block(32, 64),
            block(64, 64),
            nn.MaxPool2d(2),
            block(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, 10),
        )
        x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
        opt_of = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)  # noqa: E731
        loss_of = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    elif name == "mlp_adamw":
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
        x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
        opt_of = torch.optim.AdamW
        loss_of = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    elif name in ("lstm_adam", "gru_adam"):
        cell = nn.LSTM if name == "lstm_adam" else nn.GRU
        model = nn.ModuleDict({"rnn": cell(128, 256, num_layers=2, batch_first=True), "head": nn.Linear(256, 10)})
        x, y = torch.randn(16, 64, 128), torch.randint(0, 10, (16,))
        opt_of = torch.optim.Adam
        loss_of = lambda m, x, y: F.cross_entropy(m["head"](m["rnn"](x)[0][:, -1]), y)  # noqa: E731
    elif name in ("encoder_adamw", "encoder_infer"):
        layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        x, y = torch.randn(8, 128, 256), None
        opt_of = torch.optim.AdamW
        loss_of = lambda m, x, y: m(x).square().mean()  # noqa: E731
    else:
        raise ValueError(f"unknown workload {name!r}")
    model = model.to(dev)
    x = x.to(dev)
    y = y.to(dev) if y is not None else None
    if name == "encoder_infer":
        model.eval()

        def infer():
            with torch.inference_mode():
                return model(x).sum().item()

        return infer
    opt = opt_of(model.parameters())

    def train():
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        return loss.item()

    return train


def child(name: str, dev: str, warmup: int, steps: int) -> None:
    if dev == "tpu":
        import torch_tpu  # noqa: F401
    step = build(name, dev)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"median_s": statistics.median(times)}))


def run_side(name: str, dev: str, args) -> float:
    env = dict(os.environ)
    if dev == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run(
        [sys.executable, __file__, CHILD, name, dev, str(args.warmup), str(args.steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["median_s"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == CHILD:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workloads", default="cnn_sgd,mlp_adamw,lstm_adam,gru_adam,encoder_adamw,encoder_infer")
    args = parser.parse_args()
    results = {}
    print(f"{'workload':16s} {'tpu ms':>9s} {'cpu ms':>9s} {'tpu/cpu':>8s}")
    for name in args.workloads.split(","):
        samples = {"tpu": [], "cpu": []}
        for _ in range(args.rounds):
            for dev in ("tpu", "cpu"):
                samples[dev].append(run_side(name, dev, args))
        tpu, cpu = statistics.median(samples["tpu"]), statistics.median(samples["cpu"])
        results[name] = {"tpu_ms": tpu * 1e3, "cpu_ms": cpu * 1e3, "ratio": tpu / cpu}
        print(f"{name:16s} {tpu * 1e3:9.2f} {cpu * 1e3:9.2f} {tpu / cpu:8.2f}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
