"""``torch.tpu.pallas``: Pallas TPU kernels written in JAX, run as PyTorch ops on the vTPU.

``jax_op`` registers a JAX function (calling ``pl.pallas_call``) as a ``torch.library`` custom
op; on tpu tensors it is queued on the chip's stream like any op, every ``pallas_call`` running
in Pallas's TPU interpret mode. ``get_pallas_mesh`` builds a JAX mesh over the chips for
kernels that talk between chips. ``kernels`` wraps the TPU kernels that ship with JAX.

Needs JAX: the ``torch_tpu[pallas]`` extra. Importing this module without it raises
ImportError naming the extra; ``import torch`` / ``import torch_tpu`` never import JAX.
See docs/pallas.md.
"""

from . import _jax  # noqa: F401  (first: JAX's device count is set before JAX starts)
from ._mesh import get_default_pallas_mesh, get_pallas_mesh
from ._op import JaxOpDef, jax_op

__all__ = ["JaxOpDef", "get_default_pallas_mesh", "get_pallas_mesh", "jax_op"]


def __getattr__(name):
    if name == "kernels":  # imports the JAX kernel modules: only on use
        import importlib

        return importlib.import_module(f"{__name__}.kernels")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
