"""Which FX nodes lower to the IR, and how: the fusibility probe and the lowering of one
node into an IR region (``torch_tpu._C._compile.Region``), with the value facts the
program builder needs (strides, physical bytes, aliasing)."""

import operator

import torch
import torch.fx

from .. import _C
from .description import op_name

_RC = _C._compile
TPU = "tpu"


def node_value(n):
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def is_tpu_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == TPU


def _is_host_scalar(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.dim() == 0


_NOT_FUSIBLE_TAGS = (torch.Tag.nondeterministic_seeded,)
# Ops that have lowerings but whose ATen kernels (vectorized, on the intra-op threads)
# beat the executor's multi-pass reductions: library calls.
_ATEN_PREFERRED = {
    "aten::_softmax.default", "aten::_log_softmax.default",
    "aten::_softmax_backward_data.default", "aten::_log_softmax_backward_data.default",
}


def fusible(n: torch.fx.Node) -> bool:
    """Whether the op lowers to the IR with these arguments (probed on a scratch region)."""
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if any(t in n.target.tags for t in _NOT_FUSIBLE_TAGS) or op_name(n.target) in _ATEN_PREFERRED:
        return False
    out = node_value(n)
    if not is_tpu_tensor(out) or out.numel() == 0:
        return False
    ins = data_inputs(n)
    for a in ins:
        v = node_value(a)
        if _is_host_scalar(v):
            continue  # read when the region is queued, as eager reads it
        if not is_tpu_tensor(v) or v.device != out.device or v.numel() == 0:
            return False
    r = _RC.Region()
    try:  # a dtype without an IR element type (complex) raises here: a library call
        vals = {a: _RC.Value(r.parameter(node_value(a).dtype, list(node_value(a).shape))) for a in ins}
        res = lower(r, n, vals)
    except (TypeError, ValueError):
        return False
    return res is not None


# Factories whose result is a splat: constants inside a region (no allocation, no pass).
_FACTORIES = {
    "aten::full_like.default": lambda n: n.args[1],
    "aten::full.default": lambda n: n.args[1],
    "aten::scalar_tensor.default": lambda n: n.args[0],
    "aten::zeros_like.default": lambda n: 0,
    "aten::ones_like.default": lambda n: 1,
}


def data_inputs(n) -> list[torch.fx.Node]:
    """The inputs whose values a node reads (a full_like reads only its input's shape)."""
    if op_name(n.target) in _FACTORIES:
        return []
    return n.all_input_nodes


def lower(region, n, vals):
    fac = _FACTORIES.get(op_name(n.target))
    if fac is not None:
        value = fac(n)
        out = node_value(n)
        if not isinstance(value, (int, float, bool)) or out.layout != torch.strided:
            return None
        if out.dtype == torch.bool:
            value = float(bool(value))
        if not (out.dtype.is_floating_point or out.dtype == torch.bool) and value != int(value):
            return None
        if float(value) != value:  # an integer a double cannot hold (|v| > 2**53): ATen's kernel
            return None
        try:
            return [region.constant(float(value), out.dtype, list(out.shape))]
        except (TypeError, ValueError):
            return None

    def sub(a):
        if isinstance(a, torch.fx.Node):
            return vals[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        return a

    args = tuple(sub(a) for a in n.args)
    kwargs = {k: sub(v) for k, v in n.kwargs.items()}
    if n.target is torch.ops.aten._to_copy.default and "device" in kwargs:
        if torch.device(kwargs["device"]).type != TPU:
            return None
        kwargs.pop("device")  # the lowering sees meta operands; the device was checked here
    out = node_value(n)
    schema = n.target._schema
    return region.lower(schema.name, n.target._overloadname, args, kwargs, [(out.dtype, list(out.shape))])


def dense_strides(v) -> list[int]:
    """The FX value's strides when they are a permutation of dense ones (eager's
    layout, which later views may rely on); [] for row-major or anything else."""
    shape, stride = list(v.shape), list(v.stride())
    if stride == list(torch._prims_common.make_contiguous_strides_for(shape)):
        return []
    if not torch._prims_common.is_non_overlapping_and_dense_or_false(v):
        return []
    return stride


def physical_bytes(v) -> int:
    if not isinstance(v, torch.Tensor) or v.device.type != TPU:
        return 0
    return int(_C._physical_bytes(list(v.shape), v.element_size()))


def returns_alias(target) -> bool:
    """Whether an op's result shares memory with an argument (a view or in-place op)."""
    if not isinstance(target, torch._ops.OpOverload):
        return target is operator.getitem
    return any(r.alias_info is not None for r in target._schema.returns)
