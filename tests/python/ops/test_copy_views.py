"""Native tpu ops: empty, copies, views, fill/zero, item, printing, save/load, pinned memory."""

import io

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.devices import needs_v6e_8

pytestmark = needs_v6e_8

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool, torch.complex64]


def sample(shape=(4, 6), dtype=torch.float32):
    x = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    if dtype == torch.bool:
        return x % 3 == 0
    if dtype.is_complex:
        return torch.complex(x.float(), -x.float()).to(dtype)
    return (x % 120).to(dtype)


# --- empty / empty_strided ---------------------------------------------------

def test_empty_shape_dtype_device():
    t = torch.empty(2, 3, 4, dtype=torch.bfloat16, device="tpu:1")
    assert t.shape == (2, 3, 4) and t.dtype == torch.bfloat16 and t.device == torch.device("tpu", 1)
    assert t.stride() == (12, 4, 1)
    assert torch.empty(0, 3, device="tpu").numel() == 0


def test_empty_strided_and_memory_format():
    t = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert t.stride() == (1, 2) and t.shape == (2, 3)
    t.copy_(torch.arange(6.0).reshape(2, 3))
    assert t.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    cl = torch.empty(2, 3, 4, 5, device="tpu", memory_format=torch.channels_last)
    assert cl.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()
    assert cl.is_contiguous(memory_format=torch.channels_last)


def test_empty_negative_size_rejected():
    with pytest.raises(RuntimeError, match="negative"):
        torch.empty(2, -1, device="tpu")


# --- copies ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[1])
def test_round_trip_every_dtype(dtype):
    c = sample(dtype=dtype)
    t = c.to("tpu")
    assert t.dtype == dtype and t.device.type == "tpu"
    assert torch.equal(t.cpu(), c)


def test_non_contiguous_copies():
    c = torch.arange(60.0).reshape(3, 4, 5)
    views = [c.transpose(0, 2), c[:, ::2, 1:4], c.permute(1, 2, 0)[1:], c.expand(2, 3, 4, 5)[1]]
    for v in views:
        assert torch.equal(v.to("tpu").cpu(), v)          # host -> device from a view
    t = c.to("tpu")
    for tv, v in zip([t.transpose(0, 2), t[:, ::2, 1:4], t.permute(1, 2, 0)[1:]], views):
        assert torch.equal(tv.cpu(), v)                   # device view -> host
        assert torch.equal(tv.contiguous().cpu(), v)
    # Writing into a non-contiguous device view.
    d = torch.zeros(4, 6, device="tpu")
    d[:, 1::2] = torch.ones(4, 3)
    d.t()[0].copy_(torch.full((4,), 7.0, device="tpu"))
    expected = torch.zeros(4, 6)
    expected[:, 1::2] = 1
    expected.t()[0] = 7
    assert torch.equal(d.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3), (64, 64), (9, 130), (300, 70), (1024, 1024)])
def test_transposing_copies_match_cpu(dtype, shape):
    # Matrices copied from a transposed view (the blocked, multi-threaded kernel for 2-, 4- and
    # 8-byte elements; ATen's for the rest), from a sliced one (row stride above the row count),
    # into a transposed destination, and from host memory.
    c = sample((shape[1], shape[0] + 3), dtype)
    t = c.to("tpu")
    assert torch.equal(t[:, : shape[0]].t().contiguous().cpu(), c[:, : shape[0]].t().contiguous())
    square = sample((shape[0], shape[0]), dtype)
    assert torch.equal(square.to("tpu").t().contiguous().cpu(), square.t().contiguous())
    out = torch.empty(shape[0], shape[1], dtype=dtype, device="tpu")
    out.copy_(t[:, : shape[0]].t())
    assert torch.equal(out.cpu(), c[:, : shape[0]].t())
    assert torch.equal(c[:, : shape[0]].t().to("tpu").cpu(), c[:, : shape[0]].t())
    back = torch.empty(shape[1], shape[0], dtype=dtype, device="tpu").t()
    back.copy_(out)  # a transposed destination: not the kernel's case, ATen's copy
    assert torch.equal(back.cpu(), c[:, : shape[0]].t())


@pytest.mark.parametrize("dst_shape,src_shape", [((0, 8), (4, 8)), ((3,), (2, 3)), ((2, 3), (3, 2)), ((3,), (1, 3))])
def test_copy_shape_errors_match_cpu(dst_shape, src_shape):
    with pytest.raises(RuntimeError) as cpu_error:
        torch.empty(dst_shape).copy_(torch.empty(src_shape))
    for src_device in ("tpu", "cpu"):
        with pytest.raises(RuntimeError) as tpu_error:
            torch.empty(dst_shape, device="tpu").copy_(torch.empty(src_shape, device=src_device))
        assert str(tpu_error.value) == str(cpu_error.value)
    # Overlap is checked before shapes, as on CPU.
    c = torch.zeros(8, 8)
    with pytest.raises(RuntimeError) as cpu_error:
        c[:3].copy_(c[:4])
    t = torch.zeros(8, 8, device="tpu")
    with pytest.raises(RuntimeError) as tpu_error:
        t[:3].copy_(t[:4])
    assert str(tpu_error.value) == str(cpu_error.value)


def test_overlapping_copies_raise_at_the_call():
    # Overlaps CPU's copy_ rejects raise at the call, with CPU's message; nothing is queued.
    for make in (lambda t: (t, t.t()), lambda t: (t[:5], t[3:]), lambda t: (t[0].expand(3, 8), t[1:4])):
        c = torch.arange(64.0).reshape(8, 8)
        dst, src = make(c)
        with pytest.raises(RuntimeError) as cpu_error:
            dst.copy_(src)
        t = torch.arange(64.0).reshape(8, 8).to("tpu")
        dst, src = make(t)
        with pytest.raises(RuntimeError, match="refers? to a single memory location") as tpu_error:
            dst.copy_(src)
        assert str(tpu_error.value) == str(cpu_error.value)
        assert torch.equal(t.cpu(), torch.arange(64.0).reshape(8, 8))
    t = torch.arange(64.0).reshape(8, 8).to("tpu")
    t.copy_(t)
    t.copy_(t.view(8, 8))  # the same elements: nothing to do, as on CPU
    assert torch.equal(t.cpu(), torch.arange(64.0).reshape(8, 8))


def test_copy_between_chips():
    c = torch.randn(5, 7)
    a = c.to("tpu:0")
    b = a.to("tpu:3")
    assert b.device == torch.device("tpu", 3)
    assert torch.equal(b.cpu(), c)
    nc = a.t()[2:].to("tpu:1")                 # non-contiguous source
    assert torch.equal(nc.cpu(), c.t()[2:])
    dst = torch.zeros(7, 5, device="tpu:2")
    dst.copy_(a.t())                           # copy_ across chips into an existing tensor
    assert torch.equal(dst.cpu(), c.t())
    back = (b * 2).to("tpu:0")
    assert torch.equal(back.cpu(), c * 2)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.int32), (torch.float32, torch.bfloat16),
                                     (torch.int64, torch.float16), (torch.bool, torch.float32),
                                     (torch.float64, torch.float32), (torch.uint8, torch.int8)])
def test_dtype_converting_copies(src, dst):
    c = sample(dtype=src) * (1 if src == torch.bool else 1)
    expected = c.to(dst)
    assert torch.equal(c.to("tpu", dst).cpu(), expected)            # host -> device
    assert torch.equal(c.to("tpu").to(dst).cpu(), expected)         # on device
    assert torch.equal(c.to("tpu").to("cpu", dst), expected)        # device -> host
    assert torch.equal(c.to("tpu:0").to("tpu:1", dst).cpu(), expected)  # across chips
    out = torch.empty(c.shape, dtype=dst, device="tpu")
    out.copy_(c)
    assert torch.equal(out.cpu(), expected)


def test_broadcasting_copy():
    d = torch.empty(3, 4, device="tpu")
    d.copy_(torch.arange(4.0))
    assert torch.equal(d.cpu(), torch.arange(4.0).expand(3, 4))
    d.copy_(torch.tensor(2.5, device="tpu"))
    assert torch.equal(d.cpu(), torch.full((3, 4), 2.5))


def test_pageable_upload_is_a_snapshot(gate):
    # The stream is blocked, so the upload is queued; changing the source afterwards
    # must not change what arrives.
    gate(torch.zeros(1, device="tpu"))
    src = torch.arange(6.0)
    d = torch.empty(6, device="tpu")
    d.copy_(src)
    src.fill_(-1.0)
    gate.open()
    assert d.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_large_upload_waits_for_queued_work(gate):
    # Uploads above 1 MiB copy directly once the stream is idle; earlier queued
    # work must not overwrite them.
    big = torch.randn(512 * 1024)  # 2 MiB
    d = torch.zeros(512 * 1024, device="tpu")
    y = gate(torch.zeros(1, device="tpu"))
    d.fill_(3.0)                   # queued behind the gate
    gate.open_after(0.1)
    d.copy_(big)
    assert torch.equal(d.cpu(), big)
    del y


def test_non_blocking_from_pinned_memory(gate):
    c = torch.arange(24.0).reshape(4, 6)
    p = c.pin_memory()
    assert p.is_pinned() and not c.is_pinned()
    assert torch.equal(p, c)
    y = gate(torch.zeros(1, device="tpu"))
    t = p.to("tpu", non_blocking=True)  # queued behind the gate
    assert gate.log == []
    gate.open()
    torch.tpu.synchronize()
    assert torch.equal(t.cpu(), c)
    del y


def test_non_blocking_download_into_pinned_memory(gate):
    x = torch.tensor([0.0, 1.0, 2.0, 3.0], device="tpu")
    y = gate(x)
    out = torch.empty(4, pin_memory=True)
    assert out.is_pinned()
    out.copy_(y, non_blocking=True)  # returns before the data is there
    assert gate.log == []
    gate.open()
    torch.tpu.synchronize()
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_blocking_download_into_pinned_memory(gate):
    y = gate(torch.tensor([5.0, 6.0], device="tpu"))
    out = torch.empty(2, pin_memory=True)
    gate.open_after(0.1)
    out.copy_(y)  # blocking: waits
    assert out.tolist() == [6.0, 7.0]


def test_dataloader_pin_memory_feeds_tpu():
    xs = torch.arange(40.0).reshape(10, 4)
    ys = torch.arange(10)
    loader = DataLoader(TensorDataset(xs, ys), batch_size=4, pin_memory=True)
    sums = []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()
        xt, yt = xb.to("tpu", non_blocking=True), yb.to("tpu", non_blocking=True)
        sums.append(((xt * 2).sum() + yt.sum()).item())
    expected = [(xs[i:i + 4] * 2).sum().item() + ys[i:i + 4].sum().item() for i in range(0, 10, 4)]
    assert sums == expected


# --- views -------------------------------------------------------------------

def test_views_share_storage_and_match_cpu():
    c = torch.arange(24.0).reshape(4, 6)
    t = c.to("tpu")
    pairs = [
        (t.view(6, 4), c.view(6, 4)),
        (t.reshape(2, 12), c.reshape(2, 12)),
        (t.as_strided((3, 3), (2, 5), 1), c.as_strided((3, 3), (2, 5), 1)),
        (t[1:, 2:5], c[1:, 2:5]),
        (t.t(), c.t()),
        (t.unsqueeze(0).expand(2, 4, 6), c.unsqueeze(0).expand(2, 4, 6)),
        (t.view(torch.int32), c.view(torch.int32)),
        (t.flatten()[::5], c.flatten()[::5]),
    ]
    for tv, cv in pairs:
        assert tv.shape == cv.shape and tv.stride() == cv.stride()
        assert tv.storage_offset() == cv.storage_offset()
        assert tv.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        assert torch.equal(tv.cpu(), cv)
    # reshape of a non-contiguous tensor copies, as on CPU.
    r = t.t().reshape(24)
    assert r.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    assert torch.equal(r.cpu(), c.t().reshape(24))


@pytest.mark.parametrize("mode", ["strict", "debug"])
def test_writes_through_views(mode):
    import torch_tpu

    c = torch.zeros(4, 6)
    t = c.to("tpu")
    with torch_tpu.eager_mode(mode):
        for x in (c, t):
            x.view(24)[::7] = 1.0
            x.as_strided((2, 2), (6, 1), 8).fill_(2.0)
            x.t()[5].zero_()
            x[3].add_(5)                     # in-place op on a view with an offset
            x[1:3, ::2].mul_(3)              # ... with strides
            torch.add(x[0], 1, out=x[2])     # out= into a view
        assert torch.equal(t.cpu(), c)


def test_view_errors_match_cpu():
    t = torch.zeros(4, 6, device="tpu")
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        t.t().view(24)
    with pytest.raises(RuntimeError, match="invalid for input of size 24"):
        t.view(5, 5)


def test_set_():
    c = torch.arange(12.0)
    t = c.to("tpu")
    x = torch.empty(0, device="tpu")
    x.set_(t.untyped_storage(), 2, (2, 3), (4, 1))
    assert torch.equal(x.cpu(), c.as_strided((2, 3), (4, 1), 2))
    x.fill_(-1.0)  # shares storage with t
    expected = c.clone()
    expected.as_strided((2, 3), (4, 1), 2).fill_(-1.0)
    assert torch.equal(t.cpu(), expected)
    y = torch.empty(0, device="tpu")
    y.set_(t)
    assert y.data_ptr() == t.data_ptr() and torch.equal(y.cpu(), expected)
    z = torch.empty(0, device="tpu")
    z.set_(t.untyped_storage())
    assert z.shape == (12,) and torch.equal(z.cpu(), expected)
    y.set_()
    assert y.numel() == 0 and y.device == torch.device("tpu", 0)


def test_resize_():
    t = torch.arange(6.0, device="tpu")
    t.resize_(2, 3)
    assert t.shape == (2, 3) and t.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    t.resize_(4)
    assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    t.resize_(10)  # grows the storage and keeps the old contents
    assert t.shape == (10,)
    assert t[:6].cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    t.fill_(1.0)
    assert t.sum().item() == 10.0
    with pytest.raises(RuntimeError, match="negative"):
        t.resize_(-2)


def test_resize_waits_for_queued_writes(gate):
    y = gate(torch.tensor([0.0, 1.0], device="tpu"))
    gate.open_after(0.1)
    y.resize_(1000)  # grows: must copy the bytes the gated op writes
    assert gate.log == [True]
    assert y[:2].cpu().tolist() == [1.0, 2.0]


def test_out_variant_resizes_on_device():
    out = torch.empty(0, device="tpu")
    a = torch.arange(6.0).reshape(2, 3)
    torch.add(a.tpu(), 1, out=out)
    assert out.shape == (2, 3) and torch.equal(out.cpu(), a + 1)


# --- fill, zero, item --------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool, torch.float64])
def test_fill_and_zero(dtype):
    value = True if dtype == torch.bool else 3
    c = torch.empty(3, 5, dtype=dtype)
    t = torch.empty(3, 5, dtype=dtype, device="tpu")
    for x in (c, t):
        x.fill_(value)
        x[:, 1].zero_()
        x.t()[4].fill_(0)
    assert torch.equal(t.cpu(), c)
    assert torch.equal(torch.zeros(2, 3, dtype=dtype, device="tpu").cpu(), torch.zeros(2, 3, dtype=dtype))
    assert torch.equal(torch.full((2,), value, dtype=dtype, device="tpu").cpu(), torch.full((2,), value, dtype=dtype))


def test_fill_with_device_scalar_tensor():
    t = torch.zeros(4, device="tpu")
    t.fill_(torch.tensor(6.0, device="tpu"))
    assert t.cpu().tolist() == [6.0] * 4


def test_item():
    c = torch.randn(17, 3)
    t = c.to("tpu")
    assert t.sum().item() == c.sum().item()
    assert t[4, 1].item() == c[4, 1].item()
    assert torch.tensor(7, device="tpu").item() == 7
    assert torch.tensor(True, device="tpu").item() is True
    assert torch.tensor(2.5, dtype=torch.bfloat16, device="tpu").item() == 2.5
    assert int(torch.tensor([3], device="tpu")) == 3
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        torch.ones(2, device="tpu").item()


# --- printing ----------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.0).reshape(3, 4),
    lambda: torch.arange(12.0).reshape(3, 4).t(),
    lambda: torch.arange(24.0).reshape(2, 3, 4)[:, ::2, 1:],
    lambda: torch.arange(12.0).reshape(3, 4).to(torch.bfloat16),
    lambda: torch.arange(12).reshape(3, 4)[::2],
    lambda: torch.tensor(3.25),
    lambda: torch.empty(0, 3),
    lambda: torch.linspace(-1e6, 1e-6, 7),
    lambda: torch.arange(2000.0),  # summarized with "..."
], ids=["contiguous", "transposed", "sliced3d", "bf16", "int_strided", "scalar", "empty", "sci", "long"])
def test_print_matches_cpu(make):
    c = make()
    for dev in ("tpu:0", "tpu:2"):
        t = c.to(dev)
        expected = repr(c)
        tag = f"device='{dev}'"
        if ", dtype=" in expected:
            expected = expected.replace(", dtype=", f", {tag}, dtype=", 1)
        elif ", size=" in expected:
            expected = expected.replace(", size=", f", {tag}, size=", 1)
        else:
            expected = expected[:-1] + f", {tag})"
        assert repr(t) == expected
        assert str(t) == expected


# --- torch.save / torch.load -------------------------------------------------

def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_save_load_keeps_device_and_views():
    c = torch.randn(4, 5)
    t = c.to("tpu:2")
    loaded = torch.load(_saved({"a": t, "row": t[1], "cols": t[:, 1:3]}))
    assert loaded["a"].device == torch.device("tpu", 2)
    assert torch.equal(loaded["a"].cpu(), c)
    assert torch.equal(loaded["row"].cpu(), c[1])
    assert torch.equal(loaded["cols"].cpu(), c[:, 1:3])
    # Views still share one storage after loading.
    assert loaded["row"].untyped_storage().data_ptr() == loaded["a"].untyped_storage().data_ptr()
    loaded["a"].fill_(0.0)
    assert loaded["row"].cpu().tolist() == [0.0] * 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_save_on_tpu_load_on_cpu(dtype):
    c = sample(dtype=dtype)
    loaded = torch.load(_saved(c.to("tpu:1")), map_location="cpu")
    assert loaded.device == torch.device("cpu") and loaded.dtype == dtype
    assert torch.equal(loaded, c)


@pytest.mark.parametrize("where", ["tpu", "tpu:3", torch.device("tpu", 5), {"cpu": "tpu:4"}])
def test_save_on_cpu_load_on_tpu(where):
    c = torch.randn(3, 3)
    loaded = torch.load(_saved({"w": c}), map_location=where)["w"]
    assert loaded.device.type == "tpu"
    expected_index = {"tpu": 0, "tpu:3": 3}.get(where, 5) if not isinstance(where, dict) else 4
    assert loaded.device.index == expected_index
    assert torch.equal(loaded.cpu(), c)


def test_load_remaps_between_chips():
    c = torch.arange(6.0)
    buf = _saved(c.to("tpu:7"))
    assert torch.load(buf, map_location={"tpu:7": "tpu:1"}).device == torch.device("tpu", 1)
    buf.seek(0)
    assert torch.equal(torch.load(buf, map_location=lambda s, loc: s.tpu(6)).cpu(), c)


def test_module_state_dict_round_trip():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.tpu()
    sd = torch.load(_saved(m.state_dict()))
    for k, v in sd.items():
        assert v.device == torch.device("tpu", 0), k
        assert torch.equal(v.cpu(), ref[k]), k
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    m2.load_state_dict(torch.load(_saved(m.state_dict()), map_location="cpu"))
    for k, v in m2.state_dict().items():
        assert torch.equal(v, ref[k]), k
