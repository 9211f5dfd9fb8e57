"""Ray Train (TorchTrainer over tpu_dist, 2 workers) and Ray Data (iter_torch_batches(device="tpu")) on tpu.

Runs examples/ray_tpu.py's `run`: one data-parallel SGD step of a Linear layer; the gradients DDP
averaged over the tpu_dist group and the updated weight are checked against the same step on CPU.
"""

import importlib.util
import os

import ray
import torch

from helpers.paths import EXAMPLES_DIR


def load_example():
    spec = importlib.util.spec_from_file_location("ray_tpu_example", os.path.join(EXAMPLES_DIR, "ray_tpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_torch_trainer_tpu_dist_and_ray_data_match_cpu():
    example = load_example()
    try:
        reports = example.run(workers=2, steps=1)
    finally:
        ray.shutdown()
    assert [r["rank"] for r in reports] == [0, 1]
    assert {r["backend"] for r in reports} == {"tpu_dist"}
    assert {r["device"] for r in reports} == {"tpu"}
    assert [r["visible_chips"] for r in reports] == ["0,1,2,3", "4,5,6,7"]
    shards = [r["steps"][0]["ids"] for r in reports]
    assert sorted(shards[0] + shards[1]) == list(range(example.ROWS))

    # CPU reference: DDP's gradient is the mean over workers of each shard's mean-loss gradient.
    rows = example.make_rows()
    x = torch.tensor([r["x"] for r in rows])
    y = torch.tensor([r["y"] for r in rows])
    model = example.make_model()
    grads, losses = [], []
    for ids in shards:
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[ids]), y[ids])
        loss.backward()
        grads.append(model.weight.grad.clone())
        losses.append(loss.item())
    grad = torch.stack(grads).mean(0)
    for r, loss in zip(reports, losses):
        torch.testing.assert_close(torch.tensor(r["steps"][0]["loss"]), torch.tensor(loss))
        torch.testing.assert_close(torch.tensor(r["steps"][0]["grad"]), grad)
        torch.testing.assert_close(torch.tensor(r["weight"]), model.weight.detach() - 0.1 * grad)
