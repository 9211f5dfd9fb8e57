"""StableHLO through a real XLA (jaxlib's, the ``[pallas]`` extra): parse, verify, compile, run.

JAX is imported on first use only (``import torch_tpu`` never imports it). jaxlib entry points
used (private ones marked): ``jaxlib.mlir.ir`` (Context, Module.parse), the dialect
registration of ``jax._src.interpreters.mlir.make_ir_context`` (private),
``jax._src.interpreters.mlir.module_to_bytecode`` (private), ``jax._src.xla_bridge.get_backend``
(private; a PJRT client), ``jax._src.compiler.get_compile_options`` (private),
``Client.compile_and_load`` / ``LoadedExecutable.execute``, and
``jaxlib.mlir.dialects.stablehlo.serialize_portable_artifact`` / ``get_current_version``.
"""

import functools
import os
import threading
from typing import Any

_lock = threading.Lock()


class XlaUnavailable(RuntimeError):
    """jaxlib (the ``[pallas]`` extra) is not installed, or a named PJRT plugin is absent."""


@functools.cache
def _jax():
    try:
        import jax  # noqa: F401
        from jax._src import compiler, xla_bridge
        from jax._src.interpreters import mlir as jmlir
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo
    except ImportError as e:
        raise XlaUnavailable(f"the XLA path needs jax and jaxlib (pip install 'torch_tpu[pallas]'): {e}") from e
    return {"jax": jax, "compiler": compiler, "xla_bridge": xla_bridge, "mlir": jmlir, "ir": ir,
            "stablehlo": stablehlo}


def version() -> str:
    """``jaxlib <version> / stablehlo <version>`` (part of the persistent cache key of XLA programs)."""
    j = _jax()
    import jaxlib

    return f"jaxlib {jaxlib.__version__} stablehlo {j['stablehlo'].get_current_version()}"


def context():
    """A fresh MLIR context with the StableHLO, CHLO and func dialects registered."""
    return _jax()["mlir"].make_ir_context()


def parse(text: str, ctx=None):
    """`text` parsed and verified as an MLIR module (in `ctx`, default a fresh context).

    Raises:
        ValueError: the text does not parse or verify (MLIR's diagnostics in the message).
    """
    j = _jax()
    ctx = ctx or context()
    with ctx:
        try:
            m = j["ir"].Module.parse(text)
        except Exception as e:  # noqa: BLE001 (MLIRError and older jaxlib's ValueError)
            raise ValueError(f"StableHLO module does not parse: {e}") from e
        if not m.operation.verify():
            raise ValueError("StableHLO module does not verify")
    return m


def _platform() -> str:
    """The PJRT platform programs compile for: ``TORCH_TPU_XLA_PLATFORM`` (default ``cpu``)."""
    return os.environ.get("TORCH_TPU_XLA_PLATFORM", "cpu") or "cpu"


@functools.cache
def backend():
    """The PJRT client (``TORCH_TPU_XLA_PLATFORM``; XLA:CPU by default). A platform whose plugin
    (``TORCH_TPU_PJRT_PLUGIN``: a library path, registered under that platform name) is absent
    raises :class:`XlaUnavailable`."""
    j = _jax()
    plat = _platform()
    plugin = os.environ.get("TORCH_TPU_PJRT_PLUGIN")
    if plugin:
        if not os.path.exists(plugin):
            raise XlaUnavailable(f"TORCH_TPU_PJRT_PLUGIN={plugin!r}: no such PJRT plugin library")
        try:
            j["xla_bridge"].register_plugin(plat, library_path=plugin)
        except Exception as e:  # noqa: BLE001
            raise XlaUnavailable(f"TORCH_TPU_PJRT_PLUGIN={plugin!r} did not load as platform {plat!r}: {e}") from e
    try:
        return j["xla_bridge"].get_backend(plat)
    except Exception as e:  # noqa: BLE001 (RuntimeError: Unknown backend ...)
        raise XlaUnavailable(f"TORCH_TPU_XLA_PLATFORM={plat!r}: no PJRT client for it ({e})") from e


def compile_module(text: str):
    """`text` (a StableHLO module with ``@main``) compiled by XLA: a loaded executable.

    Raises:
        ValueError: the module does not parse / verify.
        RuntimeError: XLA rejects it (an unknown custom call, say).
    """
    j = _jax()
    m = parse(text)
    be = backend()
    devs = device_list()
    opts = j["compiler"].get_compile_options(num_replicas=1, num_partitions=1)
    with _lock:
        return be.compile_and_load(j["mlir"].module_to_bytecode(m), devs, opts)


def device_list():
    """The one-device list programs compile for (the PJRT client's first device)."""
    from jaxlib import xla_client

    return xla_client.DeviceList(tuple(backend().local_devices()[:1]))


def run(exe, arrays: list) -> list[Any]:
    """Run a compiled executable on host arrays (numpy / DLPack-capable): XLA arrays out."""
    j = _jax()
    dev = exe.local_devices()[0]
    with j["jax"].enable_x64(True):  # int64 / float64 inputs keep their width (the module's types)
        bufs = [j["jax"].device_put(a, dev) for a in arrays]
        return exe.execute(bufs)
