"""Module.to("tpu") converts parameters in place, as for CUDA."""

import torch
import torch.nn as nn

import torch_tpu


def _tied():
    torch.manual_seed(0)
    m = nn.Module()
    m.emb = nn.Embedding(16, 8)
    m.head = nn.Linear(8, 16, bias=False)
    m.head.weight = m.emb.weight
    return m


def test_tied_weights_stay_tied_and_train_like_cpu():
    cpu, dev = _tied(), _tied()
    w = dev.emb.weight
    dev = dev.to("tpu")
    assert dev.emb.weight is dev.head.weight is w  # same Parameter object, now on tpu
    assert w.device.type == "tpu"
    idx = torch.randint(0, 16, (4, 5))
    for m, i in ((cpu, idx), (dev, idx.tpu())):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = m.head(m.emb(i)).logsumexp(-1).mean()
        loss.backward()
        opt.step()
    torch.testing.assert_close(dev.emb.weight.cpu(), cpu.emb.weight)
    assert len(list(dev.parameters())) == 1


def test_optimizer_built_before_move_updates_moved_params():
    torch.manual_seed(1)
    m = nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    ref = nn.Linear(3, 2)
    ref.load_state_dict(m.state_dict())
    m.tpu()
    x = torch.randn(4, 3)
    m(x.tpu()).sum().backward()
    opt.step()
    ref(x).sum().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.5 * p.grad
    torch.testing.assert_close(m.weight.cpu(), ref.weight)


def test_debug_mode_embedding_backward_uses_table_rows():
    torch.manual_seed(2)
    emb = nn.Embedding(256, 8)
    ref = nn.Embedding(256, 8)
    ref.load_state_dict(emb.state_dict())
    emb.tpu()
    i = torch.randint(0, 256, (4, 3))
    with torch_tpu.eager_mode("debug"):
        emb(i.tpu()).pow(2).sum().backward()
    ref(i).pow(2).sum().backward()
    torch.testing.assert_close(emb.weight.grad.cpu(), ref.weight.grad)
