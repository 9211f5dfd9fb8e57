"""torch_tpu.debug.fusible_ops() and `python -m torch_tpu.debug --fusible-ops`: the printed list
is the one defer_and_fuse acts on (listed ops are recorded into regions, others run strictly)."""

import torch
import torch.nn.functional as F

import torch_tpu
import torch_tpu.debug as tdebug
from helpers.devices import needs_v6e_8


def _recorded(fn, *args):
    """ATen ops defer_and_fuse recorded while running fn(*args) on this thread."""
    tdebug.reset_region_stats()
    with torch_tpu.eager_mode("defer_and_fuse"):
        fn(*args)
        recorded = tdebug.region_stats()["ops_recorded"]
    assert tdebug.pending_ops() == 0
    return recorded


def test_fusible_ops_lists_elementwise_and_reductions_not_matmuls():
    ops = tdebug.fusible_ops()
    assert ops == sorted(ops) and len(ops) == len(set(ops))
    for label in ("aten::add.Tensor", "aten::add_.Tensor", "aten::gelu", "aten::gelu_backward",
                  "aten::sum.dim_IntList", "aten::where.self", "aten::_softmax"):
        assert label in ops
    assert not [op for op in ops if op.split(".")[0] in ("aten::mm", "aten::addmm", "aten::bmm",
                                                          "aten::convolution", "aten::native_layer_norm")]
    for op in ops:  # every label is an operator of this PyTorch
        name, _, overload = op.partition(".")
        torch._C._get_schema(name, overload)


@needs_v6e_8
def test_listed_ops_are_recorded_and_others_run_strictly():
    assert {"aten::add.Tensor", "aten::gelu"} <= set(tdebug.fusible_ops())
    assert "aten::mm" not in tdebug.fusible_ops()
    x = torch.randn(64, 64, device="tpu")
    w = torch.randn(64, 64, device="tpu")
    assert _recorded(torch.add, x, w) == 1
    assert _recorded(F.gelu, x) == 1
    assert _recorded(torch.mm, x, w) == 0


def test_command_prints_the_list(run_python):
    r = run_python("""
        import json, runpy, sys
        from contextlib import redirect_stdout
        from io import StringIO
        import torch_tpu.debug
        out = StringIO()
        sys.argv = ["torch_tpu.debug", "--fusible-ops"]
        with redirect_stdout(out):
            runpy.run_module("torch_tpu.debug", run_name="__main__")
        print(json.dumps({"printed": out.getvalue().split(), "listed": torch_tpu.debug.fusible_ops()}))
    """)
    d = r.json()
    assert d["printed"] == d["listed"] and "aten::gelu" in d["printed"]
