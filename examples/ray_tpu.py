"""Ray Train and Ray Data on tpu: a data-parallel training step over 2 workers, one process each.

The Ray node declares TPU resources (here `ray.init(resources=...)`; on a cluster, the node's
`--resources`), so Ray Train's TPU path reserves them and gives each worker its chips through
`TPU_VISIBLE_CHIPS` (torch_tpu then shows those chips as tpu:0, tpu:1, ...). `TorchConfig(backend=
"tpu_dist")` joins the workers in a `tpu_dist` process group; `ray.train.torch.prepare_model` moves
the model to `ray.train.torch.get_device()` (tpu) and wraps it in DDP; each worker reads its shard
of a Ray Dataset with `iter_torch_batches(device="tpu")`.

Run: python examples/ray_tpu.py [--workers 2] [--steps 1]
Prints one JSON line per worker: its rows, loss and the all-reduced gradient of the weight.
"""

import argparse
import json
import os
import tempfile

import torch

IN_FEATURES, OUT_FEATURES, ROWS = 4, 3, 16


def make_rows():
    """ROWS rows of (id, x, y), drawn on CPU from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(ROWS, IN_FEATURES, generator=g), torch.randn(ROWS, OUT_FEATURES, generator=g)
    return [{"id": i, "x": x[i].numpy(), "y": y[i].numpy()} for i in range(ROWS)]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(IN_FEATURES, OUT_FEATURES)


def train_loop(config):
    """One Ray Train worker: `steps` SGD steps of DDP over its dataset shard, then a JSON report file."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(make_model())  # to(device) + DDP over the tpu_dist group
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shard = ray.train.get_dataset_shard("train")
    report = {
        "rank": ctx.get_world_rank(),
        "device": str(device),
        "backend": dist.get_backend(),
        "visible_chips": os.environ.get("TPU_VISIBLE_CHIPS"),
        "steps": [],
    }
    for _ in range(config["steps"]):
        for batch in shard.iter_torch_batches(batch_size=ROWS, device=device, dtypes=torch.float32):
            assert batch["x"].device.type == "tpu", batch["x"].device
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            loss.backward()  # DDP all-reduces (averages) the gradients over tpu_dist
            report["steps"].append(
                {
                    "ids": batch["id"].cpu().long().tolist(),
                    "loss": loss.item(),
                    "grad": model.module.weight.grad.cpu().tolist(),
                }
            )
            opt.step()
    report["weight"] = model.module.weight.detach().cpu().tolist()
    with open(os.path.join(config["out_dir"], f"rank{report['rank']}.json"), "w") as f:
        json.dump(report, f)


def run(workers=2, steps=1, init_ray=True):
    """Trains on `workers` Ray workers (one tpu chip group each); returns their reports, by rank."""
    import ray
    import ray.data
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if init_ray:
        # TPU resources this node offers: 4 chips per worker, on one v6e host of 8 (topology 2x4).
        ray.init(
            num_cpus=workers,
            resources={"TPU": 4 * workers, "accelerator_type:TPU-V6E": 1},
            include_dashboard=False,
            log_to_driver=False,
        )
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"steps": steps, "out_dir": out_dir},
            torch_config=TorchConfig(backend="tpu_dist"),
            scaling_config=ScalingConfig(
                num_workers=workers,
                use_tpu=True,
                topology="2x4",
                accelerator_type="TPU-V6E",
                resources_per_worker={"TPU": 4},
            ),
            datasets={"train": ray.data.from_items(make_rows())},
        )
        trainer.fit()
        reports = []
        for rank in range(workers):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                reports.append(json.load(f))
    return reports


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    for r in run(args.workers, args.steps):
        print(json.dumps(r))
