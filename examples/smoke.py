"""A short program on the tpu device: trains a linear classifier on scikit-learn's
digits dataset (real data shipped with the package) and checks it against CPU.

Run: python examples/smoke.py
"""

import torch


def main() -> None:
    try:
        from sklearn.datasets import load_digits
        data = load_digits()
        x_all = torch.tensor(data.data, dtype=torch.float32) / 16.0
        y_all = torch.tensor(data.target)
    except ImportError:  # scikit-learn absent: synthetic but separable data
        g = torch.Generator().manual_seed(0)
        x_all = torch.randn(1797, 64, generator=g)
        y_all = (x_all[:, :10]).argmax(1)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    cpu_model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    cpu_model.load_state_dict(model.state_dict())
    model = model.to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2)
    x, y = x_all.to("tpu"), y_all.to("tpu")
    for step in range(100):
        for m, o, xx, yy in ((model, opt, x, y), (cpu_model, cpu_opt, x_all, y_all)):
            o.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(xx), yy)
            loss.backward()
            o.step()
        if step % 25 == 0:
            print(f"step {step:3d}  loss tpu {loss.item():.4f}")
    acc = (model(x).argmax(1) == y).float().mean().item()
    cpu_acc = (cpu_model(x_all).argmax(1) == y_all).float().mean().item()
    diff = max((p.cpu() - q).abs().max().item() for p, q in zip(model.parameters(), cpu_model.parameters()))
    print(f"accuracy tpu {acc:.4f}  cpu {cpu_acc:.4f}  max parameter difference {diff:.2e}")
    print(f"{torch.tpu.get_device_name()}: {torch.tpu.memory_allocated()} physical HBM bytes in use")
    assert diff < 1e-3, "tpu training diverged from CPU"


if __name__ == "__main__":
    main()
