"""A wider sweep than ops.py for finding slow ops: about 55 common operators at 1024x1024 (pooling
and normalisation, forward and backward, on [8, 64, 64, 64]; two small synchronous ops on 64x64),
tpu (strict) against CPU eager, each side in its own
process (the CPU one without torch_tpu). Per op: the fastest of --repeats samples of --iters calls
each (tpu: then torch.tpu.synchronize()), per call; printed sorted by tpu/cpu, slowest first.
Samples of a few milliseconds are hit by the scheduler ticks of docs/limits.md after idling, so
keep --iters at 100 or more.

Run: python bench/op_sweep.py [--iters 200] [--repeats 5] [--ops relu,flip]
"""

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = "--child"


def ops(dev):
    import torch
    import torch.nn.functional as F

    n = 1024
    torch.manual_seed(0)
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    pos, mask = a.abs() + 0.1, a > 0
    idx, lab = torch.randint(0, n, (n, n), device=dev), torch.randint(0, n, (n,), device=dev)
    x4 = torch.randn(8, 64, 64, 64, device=dev)
    # Backward passes: one graph each, differentiated again every call.
    grad4, grad2 = torch.randn_like(x4), torch.randn_like(a)
    leaf4, leaf2 = x4.clone().requires_grad_(), a.clone().requires_grad_()
    w64, b64, w_n = (torch.randn(k, device=dev).requires_grad_() for k in (64, 64, n))
    gn_out = F.group_norm(leaf4, 8, w64, b64)
    bn_out = F.batch_norm(leaf4, None, None, w64, b64, training=True)
    ln_out = F.layer_norm(leaf2, (n,), w_n)
    small, small_mask = a[:64, :64].clone(), mask[:64, :64].clone()  # synchronous, on the calling thread
    return {
        "relu": lambda: F.relu(a),
        "sigmoid": lambda: torch.sigmoid(a),
        "tanh": lambda: torch.tanh(a),
        "silu": lambda: F.silu(a),
        "erf": lambda: torch.erf(a),
        "sin": lambda: torch.sin(a),
        "sqrt": lambda: torch.sqrt(pos),
        "rsqrt": lambda: torch.rsqrt(pos),
        "log": lambda: torch.log(pos),
        "pow 2.5": lambda: torch.pow(pos, 2.5),
        "div": lambda: a / b,
        "clamp": lambda: a.clamp(-0.5, 0.5),
        "abs": lambda: a.abs(),
        "eq": lambda: a == b,
        "mul+add": lambda: a * b + a,
        "masked_fill": lambda: a.masked_fill(mask, 0.0),
        "where(scalar)": lambda: torch.where(mask, a, 0.0),
        "argmax(1)": lambda: a.argmax(1),
        "max(1)": lambda: a.max(1),
        "topk(8, 1)": lambda: a.topk(8, 1),
        "sort(1)": lambda: a.sort(1),
        "cumsum(1)": lambda: a.cumsum(1),
        "sum(0)": lambda: a.sum(0),
        "mean(1)": lambda: a.mean(1),
        "var(1)": lambda: a.var(1),
        "std": lambda: a.std(),
        "norm": lambda: a.norm(),
        "log_softmax": lambda: F.log_softmax(a, -1),
        "cross_entropy": lambda: F.cross_entropy(a, lab),
        "nll_loss": lambda: F.nll_loss(a, lab),
        "mse_loss": lambda: F.mse_loss(a, b),
        "scatter_add_": lambda: torch.zeros(n, n, device=dev).scatter_add_(1, idx, a),
        "index_add_": lambda: torch.zeros(n, n, device=dev).index_add_(0, lab, a),
        "bmm": lambda: torch.bmm(a.view(16, 64, n)[:, :, :64], a.view(16, 64, n)[:, :64, :]),
        "flip": lambda: a.flip(0),
        "roll": lambda: a.roll(3, 1),
        "tril": lambda: a.tril(),
        "pad": lambda: F.pad(a, (1, 1, 1, 1)),
        "repeat": lambda: a[:256].repeat(2, 2),
        "expand+contiguous": lambda: a[:1].expand(n, n).contiguous(),
        "clone": lambda: a.clone(),
        "zeros": lambda: torch.zeros(n, n, device=dev),
        "arange": lambda: torch.arange(n * n, device=dev),
        "to bf16": lambda: a.to(torch.bfloat16),
        "max_pool2d": lambda: F.max_pool2d(x4, 2),
        "avg_pool2d": lambda: F.avg_pool2d(x4, 2),
        "interpolate": lambda: F.interpolate(x4, scale_factor=2, mode="nearest"),
        "batch_norm": lambda: F.batch_norm(x4, None, None, training=True),
        "group_norm": lambda: F.group_norm(x4, 8),
        "rms_norm": lambda: F.rms_norm(a, (n,)),
        "nonzero": lambda: mask.nonzero(),
        "group_norm backward": lambda: torch.autograd.grad(gn_out, (leaf4, w64, b64), grad4, retain_graph=True),
        "batch_norm backward": lambda: torch.autograd.grad(bn_out, (leaf4, w64, b64), grad4, retain_graph=True),
        "layer_norm backward": lambda: torch.autograd.grad(ln_out, (leaf2, w_n), grad2, retain_graph=True),
        "nonzero 64x64": lambda: small_mask.nonzero(),
        "x[mask] 64x64": lambda: small[small_mask],
    }


def child(dev, iters, repeats, only):
    import torch

    if dev == "tpu":
        import torch_tpu  # noqa: F401
    sync = torch.tpu.synchronize if dev == "tpu" else (lambda: None)
    times = {}
    for name, fn in ops(dev).items():
        if only and name not in only:
            continue
        fn()
        fn()
        sync()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            sync()
            best = min(best, (time.perf_counter() - t) / iters)
        times[name] = best
    print(json.dumps(times))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    a = p.parse_args()
    sides = {}
    for dev, env in (("cpu", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}), ("tpu", {})):
        args = [sys.executable, __file__, CHILD, dev, str(a.iters), str(a.repeats), a.ops]
        out = subprocess.run(args, env=os.environ | env, capture_output=True, text=True, check=True).stdout
        sides[dev] = json.loads(out.splitlines()[-1])
    rows = sorted(((sides["tpu"][k] / sides["cpu"][k], k) for k in sides["tpu"]), reverse=True)
    print(f"{'op':20} {'tpu us':>10} {'cpu us':>10} {'tpu/cpu':>8}")
    for r, k in rows:
        print(f"{k:20} {sides['tpu'][k] * 1e6:10.1f} {sides['cpu'][k] * 1e6:10.1f} {r:8.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), set(filter(None, sys.argv[5].split(","))))
    else:
        main()
