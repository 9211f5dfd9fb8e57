"""torch.tpu.ops SparseCore embedding ops (TensorCore reference implementations) against dense CPU
equivalents: sparse_dense_matmul (a dense [batch, vocab] matrix of gains times the table), its fused
SGD / Adagrad / Adam backward, activation unstack / gradient stack, CSR sparse_gather with backward,
sparse_iota; sparse_map_row's NotImplementedError; bad input."""

import pytest
import torch

import torch_tpu  # noqa: F401
import torch_tpu.tpu.ops as ops
from helpers.devices import needs_v6e_8
from torch_tpu.tpu.ops._sparse import PAD_VALUE

pytestmark = needs_v6e_8

DEV = "tpu"
V, D, BATCH = 11, 6, 5


def _layout(rows, align=8, capacity=40):
    """The SparseCore layout for rows of (embedding_id, sample_id, gain): each row starts at a multiple
    of ``align``, ends at its row pointer, and padding (PAD_VALUE ids, gain 0) fills the gaps and the tail."""
    eids, sids, gains, rp = [], [], [], []
    for row in rows:
        while len(eids) % align:
            eids.append(PAD_VALUE), sids.append(PAD_VALUE), gains.append(0.0)
        for e, s, g in row:
            eids.append(e), sids.append(s), gains.append(g)
        rp.append(len(eids))
    eids += [PAD_VALUE] * (capacity - len(eids))
    sids += [PAD_VALUE] * (capacity - len(sids))
    gains += [0.0] * (capacity - len(gains))
    return (torch.tensor(rp, dtype=torch.int32), torch.tensor(eids, dtype=torch.int32),
            torch.tensor(sids, dtype=torch.int32), torch.tensor(gains))


ROWS = [[(3, 0, 1.0), (3, 1, 0.5), (7, 0, 2.0), (0, 4, 1.0), (10, 2, -1.0)],
        [(3, 3, 1.5), (1, 3, 1.0), (7, 4, 0.25)]]


def _dense(rows):
    a = torch.zeros(BATCH, V, dtype=torch.float64)
    for row in rows:
        for e, s, g in row:
            a[s, e] += g
    return a


def _on(dev, *ts):
    return [t.to(dev) for t in ts]


def test_sparse_dense_matmul_matches_dense_matmul_and_differentiates_the_table():
    table = torch.randn(V, D, generator=torch.Generator().manual_seed(0))
    layout = _on(DEV, *_layout(ROWS))
    t = table.to(DEV).requires_grad_(True)
    out = ops.sparse_dense_matmul(*layout, t, BATCH, 8, 8)
    a = _dense(ROWS)
    torch.testing.assert_close(out.detach().cpu().double(), a @ table.double(), atol=1e-5, rtol=1e-5)
    grad = torch.randn(BATCH, D, generator=torch.Generator().manual_seed(1))
    out.backward(grad.to(DEV))
    torch.testing.assert_close(t.grad.cpu().double(), a.T @ grad.double(), atol=1e-5, rtol=1e-5)
    # torch.ops.tpu spelling (TorchRec calls it there) gives the same
    again = torch.ops.tpu.sparse_dense_matmul(*layout, table.to(DEV), BATCH, 8, 8)
    torch.testing.assert_close(again.cpu(), out.detach().cpu())


def _grad_setup():
    g = torch.Generator().manual_seed(2)
    table = torch.randn(V, D, generator=g)
    act_grad = torch.randn(BATCH, D, generator=g)
    table_grad = (_dense(ROWS).T @ act_grad.double()).float()  # dense: d table = A^T d activations
    touched = torch.zeros(V, dtype=torch.bool)
    touched[[e for row in ROWS for e, _, _ in row]] = True
    return table, act_grad, table_grad, touched


def test_grad_with_sgd_matches_dense_step():
    table, act_grad, g, _ = _grad_setup()
    lr = torch.tensor(0.1)
    new = ops.sparse_dense_matmul_grad_with_sgd(*_on(DEV, *_layout(ROWS)), table.to(DEV), act_grad.to(DEV),
                                                lr.to(DEV), BATCH, 8, 8, "sgd_table")
    torch.testing.assert_close(new.cpu(), table - 0.1 * g, atol=1e-6, rtol=1e-5)
    opt_table = table.clone().requires_grad_(True)  # the same step as torch.optim.SGD on the dense gradient
    opt = torch.optim.SGD([opt_table], lr=0.1)
    opt_table.grad = g.clone()
    opt.step()
    torch.testing.assert_close(new.cpu(), opt_table.detach(), atol=1e-6, rtol=1e-5)


def test_grad_with_adagrad_matches_dense_step_on_touched_rows():
    table, act_grad, g, touched = _grad_setup()
    acc = torch.rand(V, D, generator=torch.Generator().manual_seed(3)) + 0.1
    new_table, new_acc = ops.sparse_dense_matmul_grad_with_adagrad(
        *_on(DEV, *_layout(ROWS)), table.to(DEV), acc.to(DEV), act_grad.to(DEV), torch.tensor([0.05], device=DEV),
        1e-6, BATCH, 8, 8, "adagrad_table")
    want_acc = torch.where(touched[:, None], acc + g * g, acc)
    want = torch.where(touched[:, None], table - 0.05 * g / (want_acc.sqrt() + 1e-6), table)
    torch.testing.assert_close(new_acc.cpu(), want_acc, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(new_table.cpu(), want, atol=1e-6, rtol=1e-5)


def test_grad_with_adam_matches_dense_lazy_adam():
    table, act_grad, g, touched = _grad_setup()
    gen = torch.Generator().manual_seed(4)
    m, v = torch.randn(V, D, generator=gen) * 0.1, torch.rand(V, D, generator=gen) * 0.1
    b1, b2, eps, alpha = 0.9, 0.99, 1e-7, 0.01
    new_table, new_m, new_v = ops.sparse_dense_matmul_grad_with_adam(
        *_on(DEV, *_layout(ROWS)), table.to(DEV), m.to(DEV), v.to(DEV), act_grad.to(DEV),
        torch.tensor(alpha, device=DEV), b1, b2, eps, BATCH, 8, 8, "adam_table")
    rows = touched[:, None]
    want_m = torch.where(rows, b1 * m + (1 - b1) * g, m)
    want_v = torch.where(rows, b2 * v + (1 - b2) * g * g, v)
    want = torch.where(rows, table - alpha * want_m / (want_v.sqrt() + eps), table)
    for ours, theirs in ((new_m, want_m), (new_v, want_v), (new_table, want)):
        torch.testing.assert_close(ours.cpu(), theirs, atol=1e-6, rtol=1e-5)


def test_activation_unstack_and_gradient_stack_are_inverse_slicings():
    stacked = torch.randn(9, 8, generator=torch.Generator().manual_seed(5))
    parts = ops.sparse_dense_matmul_activation_unstack(stacked.to(DEV), (3, 4), [8, 5])
    assert [p.shape for p in parts] == [(3, 8), (4, 5)]
    torch.testing.assert_close(parts[0].cpu(), stacked[:3])
    torch.testing.assert_close(parts[1].cpu(), stacked[3:7, :5])
    back = ops.sparse_dense_matmul_gradient_stack(parts, 9, 8)
    want = torch.zeros(9, 8)
    want[:3], want[3:7, :5] = stacked[:3], stacked[3:7, :5]
    torch.testing.assert_close(back.cpu(), want)


def test_sparse_gather_backward_and_iota_match_dense_csr():
    rp = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # rows of 2, 0 and 3 entries, then 1 padding entry
    idx = torch.tensor([4, 1, 0, 4, 2, 99], dtype=torch.int32)
    operand = torch.randn(5, 3, generator=torch.Generator().manual_seed(6))
    o = operand.to(DEV).requires_grad_(True)
    out = ops.sparse_gather(rp.to(DEV), idx.to(DEV), o, 3)
    want = torch.zeros(6, 3)
    want[:5] = operand[idx[:5].long()]
    torch.testing.assert_close(out.detach().cpu(), want)
    grad = torch.randn(6, 3, generator=torch.Generator().manual_seed(7))
    out.backward(grad.to(DEV))
    dense = torch.zeros(5, 3).index_add_(0, idx[:5].long(), grad[:5])  # padding carries no gradient
    torch.testing.assert_close(o.grad.cpu(), dense)
    base = torch.ones(5, 3)
    torch.testing.assert_close(ops.sparse_gather_backward(grad[:5].to(DEV), idx[:5].to(DEV), base.to(DEV)).cpu(),
                               base + dense)
    iota = ops.sparse_iota(rp.to(DEV), 8, 3)
    assert iota.dtype == torch.int32 and iota.device.type == "tpu"
    assert iota.cpu().tolist() == [0, 1, 0, 1, 2, 0, 0, 0]


def test_sparse_map_row_raises_naming_why():
    with pytest.raises(NotImplementedError, match="MLIR function for the SparseCore"):
        ops.sparse_map_row([], [], [], "func.func @body() {}", [], 8, 0, 0, 0.5, 0)


def _sdmm(**change):
    rp, e, s, g = _layout(ROWS)
    args = dict(row_pointers=rp, embedding_ids=e, sample_ids=s, gains=g, embedding_table=torch.zeros(V, D),
                device_batch_size=BATCH, max_ids_per_partition=8, max_unique_ids_per_partition=8)
    args.update(change)
    args = {k: (t.to(DEV) if isinstance(t, torch.Tensor) else t) for k, t in args.items()}
    return lambda: ops.sparse_dense_matmul(**args)


def _with(t, i, value):
    t = t.clone()
    t[i] = value
    return t


_RP, _E, _S, _G = _layout(ROWS)
BAD = [
    (_sdmm(embedding_ids=_with(_E, 1, V)), ValueError, r"embedding_ids\[1\] = 11 is out of range"),
    (_sdmm(embedding_ids=_with(_E, 0, -2)), ValueError, r"embedding_ids\[0\] = -2 is out of range"),
    (_sdmm(sample_ids=_with(_S, 9, BATCH)), ValueError, r"sample_ids\[9\] = 5 is out of range for device_batch_size"),
    (_sdmm(sample_ids=_S[:-1]), ValueError, "sample_ids has 39 entries, embedding_ids has 40"),
    (_sdmm(gains=_G.int()), TypeError, "gains must have a floating dtype"),
    (_sdmm(embedding_table=torch.zeros(V)), ValueError, "embedding_table must be 2-D"),
    (_sdmm(row_pointers=torch.tensor([11, 5], dtype=torch.int32)), ValueError, "row_pointers must be non-decreasing"),
    (_sdmm(row_pointers=torch.tensor([5, 41], dtype=torch.int32)), ValueError, r"row_pointers must lie in \[0, 40\]"),
    (_sdmm(max_ids_per_partition=4), ValueError, "row 0 of row_pointers holds 5 ids, more than max_ids_per_partition"),
    (_sdmm(max_unique_ids_per_partition=3), ValueError, "4 distinct ids, more than max_unique_ids_per_partition"),
    (_sdmm(device_batch_size=0), ValueError, "device_batch_size must be a positive int"),
    (lambda: ops.sparse_dense_matmul_grad_with_sgd(*_on(DEV, _RP, _E, _S, _G), torch.zeros(V, D, device=DEV),
                                                   torch.zeros(BATCH + 1, D, device=DEV),
                                                   torch.tensor(0.1, device=DEV), BATCH, 8, 8, "sgd"),
     ValueError, r"activations_grad must be \[device_batch_size, dim\]"),
    (lambda: ops.sparse_dense_matmul_grad_with_adagrad(*_on(DEV, _RP, _E, _S, _G), torch.zeros(V, D, device=DEV),
                                                       torch.zeros(V, D + 1, device=DEV),
                                                       torch.zeros(BATCH, D, device=DEV),
                                                       torch.tensor(0.1, device=DEV), 1e-6, BATCH, 8, 8, "ada"),
     ValueError, "accumulator must have embedding_table's shape"),
    (lambda: ops.sparse_dense_matmul_activation_unstack(torch.zeros(6, 4, device=DEV), [3, 4], [4, 4]), ValueError,
     "per_feature_batch_sizes sum to 7, more than the 6 rows"),
    (lambda: ops.sparse_dense_matmul_activation_unstack(torch.zeros(6, 4, device=DEV), [3], [4, 4]), ValueError,
     "per_feature_batch_sizes has 1 entries, per_feature_dims 2"),
    (lambda: ops.sparse_dense_matmul_gradient_stack([torch.zeros(3, 5, device=DEV)], 4, 4), ValueError,
     r"unstacked_gradients\[0\] has 5 columns, more than stacked_feature_dim = 4"),
    (lambda: ops.sparse_gather(torch.tensor([0, 2], device=DEV), torch.tensor([0, 7], device=DEV),
                               torch.zeros(5, 2, device=DEV), 4), ValueError, r"indices\[1\] = 7 is out of range"),
    (lambda: ops.sparse_gather(torch.tensor([0, 3], device=DEV), torch.tensor([0, 1, 2], device=DEV),
                               torch.zeros(5, 2, device=DEV), 2), ValueError, "more than max_non_zeroes_per_row = 2"),
    (lambda: ops.sparse_gather_backward(torch.zeros(2, 3, device=DEV), torch.tensor([0, 1], device=DEV),
                                        torch.zeros(4, 2, device=DEV)), ValueError, "grad_output must be"),
    (lambda: ops.sparse_iota(torch.tensor([0, 3, 9], device=DEV), 8, 8), ValueError,
     r"row_pointers must lie in \[0, 8\]"),
]


@pytest.mark.parametrize("call,exc,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_input_raises_at_the_call_naming_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
    out = ops.sparse_dense_matmul(*_on(DEV, *_layout(ROWS)), torch.ones(V, D, device=DEV), BATCH, 8, 8)
    assert out.cpu()[3].tolist() == [2.5] * D  # the process keeps working
