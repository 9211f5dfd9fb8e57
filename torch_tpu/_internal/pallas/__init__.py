"""``torch_tpu._internal.pallas``: the paths TorchRec (``pallas.jax_op``), Helion
(``pallas.JaxCallable``, ``pallas.jax_placeholder``, ``tpu_torch_pallas``,
``get_default_pallas_mesh``) and PyTorch's Inductor (``tpu_torch_pallas``) import. Private;
the public names are ``torch.tpu.pallas``'s. Importing it imports JAX (ImportError naming the
``torch_tpu[pallas]`` extra without it)."""

from torch_tpu.tpu.pallas import get_default_pallas_mesh, get_pallas_mesh, jax_op

from . import pallas, tpu_torch_pallas

__all__ = ["get_default_pallas_mesh", "get_pallas_mesh", "jax_op", "pallas", "tpu_torch_pallas"]
