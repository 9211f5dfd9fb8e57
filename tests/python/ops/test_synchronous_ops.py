"""Ops that run at once (output shapes from data, host results, meta kernels that disagree with
CPU's): large ones run on the stream's worker, whose OpenMP team splits them as CPU eager's does,
small ones on the calling thread. Either way: CPU's values, its errors raised at the call with its
type and message, its warnings given at the call, and the chip usable afterwards."""

import warnings

import pytest
import torch
import torch.nn.functional as F

LARGE = (8, 16, 32, 32)  # 131072 elements: past ATen's grain size (32768), so on the worker
SMALL = (2, 3, 4, 4)


@pytest.mark.parametrize("shape", [LARGE, SMALL])
def test_batch_norm_training_equals_cpu(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 3 + 1
    weight, bias = torch.randn(shape[1]), torch.randn(shape[1])
    got = torch.native_batch_norm(x.to("tpu"), weight.to("tpu"), bias.to("tpu"), None, None, True, 0.1, 1e-5)
    want = torch.native_batch_norm(x, weight, bias, None, None, True, 0.1, 1e-5)
    for g, w in zip(got, want):
        assert g.device.type == "tpu"
        assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("shape", [LARGE, SMALL])
def test_batch_norm_updates_running_stats_as_cpu(shape):
    torch.manual_seed(1)
    x = torch.randn(shape)
    mean, var = torch.zeros(shape[1]), torch.ones(shape[1])
    t_mean, t_var = mean.to("tpu"), var.to("tpu")
    got = F.batch_norm(x.to("tpu"), t_mean, t_var, training=True, momentum=0.3)
    want = F.batch_norm(x, mean, var, training=True, momentum=0.3)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(t_mean.cpu(), mean)
    assert torch.equal(t_var.cpu(), var)


@pytest.mark.parametrize("numel", [1 << 20, 100])
def test_nonzero_equals_cpu_after_queued_work(numel):
    x = torch.randn(numel)
    t = x.to("tpu")
    for _ in range(3):  # queued work the synchronous op must wait for
        t = t * 1.5 - 0.25
        x = x * 1.5 - 0.25
    got = (t > 0).nonzero()
    assert torch.equal(got.cpu(), (x > 0).nonzero())
    assert torch.equal(t.cpu(), x)


@pytest.mark.parametrize("numel", [1 << 17, 64])
def test_data_dependent_error_raised_at_the_call(numel):
    inp = torch.rand(numel)
    inp[numel // 2] = 1.5  # outside [0, 1]: CPU's kernel raises
    target = torch.rand(numel)
    with pytest.raises(RuntimeError) as cpu_error:
        F.binary_cross_entropy(inp, target)
    t_inp, t_target = inp.to("tpu"), target.to("tpu")
    with pytest.raises(RuntimeError) as tpu_error:
        F.binary_cross_entropy(t_inp, t_target)
    assert str(tpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]
    # Raised once, at the call: the chip goes on, and nothing the user had is lost.
    torch.tpu.synchronize()
    assert torch.equal(t_inp.cpu(), inp)
    inp[numel // 2] = 0.5
    got = F.binary_cross_entropy(inp.to("tpu"), t_target)
    assert torch.equal(got.cpu(), F.binary_cross_entropy(inp, target))


@pytest.mark.parametrize("numel", [1 << 17, 64])
def test_out_resize_warning_given_at_the_call(numel):
    mask = torch.arange(numel) % 3 == 0
    out = torch.empty(5, 1, dtype=torch.long)  # wrong shape, not empty: resized with a warning
    with warnings.catch_warnings(record=True) as cpu_warnings:
        warnings.simplefilter("always")
        torch.nonzero(mask, out=out)
    t_out = torch.empty(5, 1, dtype=torch.long, device="tpu")
    with warnings.catch_warnings(record=True) as tpu_warnings:
        warnings.simplefilter("always")
        torch.nonzero(mask.to("tpu"), out=t_out)
    assert cpu_warnings
    assert [str(w.message) for w in tpu_warnings] == [str(w.message) for w in cpu_warnings]
    assert torch.equal(t_out.cpu(), out)


def test_large_synchronous_op_from_two_threads():
    # Two user threads, each on its own stream's worker: each gets its own values.
    import threading

    torch.manual_seed(2)
    inputs = [torch.randn(LARGE) for _ in range(2)]
    results = [None, None]

    def work(i):
        with torch.tpu.stream(torch.tpu.Stream()):
            x = inputs[i].to("tpu")
            for _ in range(5):
                results[i] = F.batch_norm(x, None, None, training=True).cpu()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(2):
        assert torch.equal(results[i], F.batch_norm(inputs[i], None, None, training=True))


def _batch_norm_case(case):
    torch.manual_seed(3)
    x = torch.randn(LARGE)
    mean, var = torch.randn(LARGE[1]), torch.rand(LARGE[1]) + 0.5
    training = case != "eval"
    if case == "bfloat16":
        x = x.bfloat16()
    if case == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    if case == "transposed":
        x = x.transpose(2, 3)
    return x, mean, var, training


@pytest.mark.parametrize("case", ["float32", "channels_last"])
def test_float32_training_batch_norm_is_queued(gate, case):
    # Its meta kernel agrees with CPU's here: queued like other ops, written straight into HBM.
    x, mean, var, training = _batch_norm_case(case)
    t_mean, t_var = mean.to("tpu"), var.to("tpu")
    gated = gate(x.to("tpu"))  # x + 1, computed once the gate opens
    out = torch.native_batch_norm(gated, None, None, t_mean, t_var, training, 0.1, 1e-5)
    assert gate.log == []  # returned without waiting for the chip
    gate.open()
    want = torch.native_batch_norm(x + 1, None, None, mean, var, training, 0.1, 1e-5)
    for g, w in zip(out, want):
        assert g.stride() == w.stride()
        assert torch.equal(g.cpu(), w)
    assert torch.equal(t_mean.cpu(), mean)
    assert torch.equal(t_var.cpu(), var)


@pytest.mark.parametrize("case", ["eval", "bfloat16", "transposed"])
def test_other_batch_norm_calls_take_cpu_shapes(gate, case):
    # Meta and CPU kernels disagree here (eval: CPU's save_mean is empty; bf16: its dtype;
    # transposed input: result strides): run at once, on CPU's own results.
    x, mean, var, training = _batch_norm_case(case)
    t_mean, t_var = mean.to("tpu"), var.to("tpu")
    gated = gate(x.to("tpu"))  # x + 1
    gate.open_after(0.2)
    out = torch.native_batch_norm(gated, None, None, t_mean, t_var, training, 0.1, 1e-5)
    assert gate.log == [True]  # waited for the chip
    want = torch.native_batch_norm(x + 1, None, None, mean, var, training, 0.1, 1e-5)
    for g, w in zip(out, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        assert torch.equal(g.cpu(), w)
    assert torch.equal(t_mean.cpu(), mean)
    assert torch.equal(t_var.cpu(), var)


@pytest.mark.parametrize(
    "mask", [[False, True, True], [False, False, True], [False, False, False], [True, True, False]]
)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_backward_output_mask_as_cpu(mask, training):
    # CPU's kernel returns None where output_mask is False; the meta kernel gives a grad_input
    # anyway, which the tpu's queued kernel then failed to fill ("doesn't have storage").
    torch.manual_seed(4)
    g, x = torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)
    w, mean, var = torch.randn(3), torch.randn(3), torch.rand(3) + 0.5
    _, save_mean, save_invstd = torch.native_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)
    stats = (None, None, save_mean, save_invstd) if training else (mean, var, None, None)

    def call(dev):
        on = [t if t is None else t.to(dev) for t in (g, x, w, *stats)]
        return torch.ops.aten.native_batch_norm_backward(*on, training, 1e-5, mask)

    for got, want in zip(call("tpu"), call("cpu")):
        assert (got is None) == (want is None)
        if want is not None:
            assert torch.equal(got.cpu(), want)


def test_batch_norm_on_input_without_grad_trains_as_cpu():
    torch.manual_seed(5)
    x = torch.randn(16, 4) * 2 + 1
    cpu, tpu = torch.nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4).to("tpu")
    cpu(x).pow(2).sum().backward()
    tpu(x.to("tpu")).pow(2).sum().backward()
    torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad)
    torch.testing.assert_close(tpu.bias.grad.cpu(), cpu.bias.grad)
    torch.testing.assert_close(tpu.running_var.cpu(), cpu.running_var)


@pytest.mark.parametrize("numel", [1 << 17, 1000])
def test_cpu_autocast_leaves_synchronous_tpu_ops_alone(numel):
    # torch.autocast("cpu") is about CPU tensors: a tpu op runs in its inputs' dtype whichever
    # thread its CPU kernel runs on (the calling thread's autocast state used to leak in).
    torch.manual_seed(6)
    a, b = torch.rand(numel).bfloat16(), torch.rand(numel).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = F.binary_cross_entropy(a.to("tpu"), b.to("tpu"))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), F.binary_cross_entropy(a, b))


@pytest.mark.parametrize("numel", [1 << 17, 64])
def test_warning_before_an_error_given_at_the_call(numel, capfd):
    # CPU warns that out= was resized, then raises on the index. With an exception in flight,
    # PyTorch prints the warning to stderr rather than through `warnings`: so does tpu.
    x = torch.randn(numel, 4)
    mask = torch.arange(numel) % 2 == 0
    idx = torch.full((numel // 2,), 10)
    results = {}
    for dev in ("cpu", "tpu"):
        out = torch.empty(7, device=dev)
        capfd.readouterr()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(IndexError) as error:
                torch.ops.aten.index.Tensor_out(x.to(dev), [mask.to(dev), idx.to(dev)], out=out)
        printed = capfd.readouterr().err
        told = [str(w.message) for w in caught] + [line for line in printed.splitlines() if "resized" in line]
        results[dev] = (sum("resized" in t for t in told), str(error.value))
    assert results["tpu"] == results["cpu"]
    assert results["cpu"][0] == 1


@pytest.mark.parametrize("numel", [1 << 17, 4])
def test_out_overlapping_the_input_rejected_as_on_cpu(numel):
    values = torch.arange(numel, dtype=torch.float32) - numel / 2
    with pytest.raises(RuntimeError) as cpu_error:
        torch.masked_select(values.clone(), values > 0, out=values.clone())  # no overlap: fine
        x = values.clone()
        torch.masked_select(x, x > 0, out=x)
    x = values.to("tpu")
    with pytest.raises(RuntimeError) as tpu_error:
        torch.masked_select(x, x > 0, out=x)
    assert str(tpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]
    assert torch.equal(x.cpu(), values)  # nothing the user had is lost


@pytest.mark.parametrize("out_shape", [(0,), (3, 3), (12, 2)])
def test_nonzero_out_takes_cpu_strides(out_shape):
    x = torch.randn(6, 2)
    x[0, 1] = 0
    want = torch.empty(out_shape, dtype=torch.long)
    got = torch.empty(out_shape, dtype=torch.long, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.nonzero(x, out=want)
        torch.nonzero(x.to("tpu"), out=got)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got.cpu(), want)


def test_first_call_check_tells_output_masks_apart():
    # A mask CPU rejects after one it accepts: raised at the call, not at a later synchronize.
    x, g = torch.randn(2, 8, 4, 4), torch.randn(2, 8, 4, 4)
    _, mean, rstd = torch.native_group_norm(x, None, None, 2, 8, 16, 4, 1e-5)
    on_tpu = [t.to("tpu") for t in (g, x, mean, rstd)]
    ok = torch.ops.aten.native_group_norm_backward(*on_tpu, None, 2, 8, 16, 4, [True, False, False])
    with pytest.raises(RuntimeError) as cpu_error:
        torch.ops.aten.native_group_norm_backward(g, x, mean, rstd, None, 2, 8, 16, 4, [True, True, True])
    with pytest.raises(RuntimeError) as tpu_error:
        torch.ops.aten.native_group_norm_backward(*on_tpu, None, 2, 8, 16, 4, [True, True, True])
    assert str(tpu_error.value).splitlines()[0] == str(cpu_error.value).splitlines()[0]
    torch.tpu.synchronize()
    want = torch.ops.aten.native_group_norm_backward(g, x, mean, rstd, None, 2, 8, 16, 4, [True, False, False])
    assert torch.equal(ok[0].cpu(), want[0])
