"""The machinery of the ``torch.tpu`` namespace: the module type (properties, lazily
resolved submodules, ``dir()``) and the import alias ``torch.tpu.<sub>`` ->
``torch_tpu.tpu.<sub>``. Private; ``torch_tpu/tpu/__init__.py`` calls :func:`install`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from . import _device, _modes

_PROPERTIES = ("allow_excess_precision", "eager_mode")


class NotAvailableError(NotImplementedError, AttributeError):
    """A TorchTPU name this build does not offer. A NotImplementedError that names it and says
    why; an AttributeError too, so ``hasattr()`` is False and ``getattr(..., None)`` is None for
    code that probes (``torch.tpu.ops.MissingOpError`` is this class)."""


def not_available(qualname: str, what: str, why: str | None) -> NotAvailableError:
    """The error for a TorchTPU name this build does not offer: names it, says what it is and why."""
    return NotAvailableError(f"{qualname} ({what}) is not available: {why or 'missing from this installation'}")


class _Submodules:
    """The table of ``torch.tpu``'s submodules, resolved on demand."""

    def __init__(self, package: str, table: dict[str, tuple[str, str | None]]):
        self.package = package
        self.table = table

    def present(self, name: str) -> bool:
        full = f"{self.package}.{name}"
        # The path finder itself: the meta-path finder below asks this for the package's names.
        return full in sys.modules or importlib.machinery.PathFinder.find_spec(
            full, sys.modules[self.package].__path__) is not None

    def error(self, name: str) -> NotAvailableError:
        what, why = self.table[name]
        return not_available(f"torch.tpu.{name}", what, why)

    def load(self, name: str) -> types.ModuleType:
        """``<package>.<name>`` imported; NotAvailableError naming ``torch.tpu.<name>`` if it is missing."""
        if not self.present(name):
            raise self.error(name)
        return importlib.import_module(f"{self.package}.{name}")


class TPUModule(types.ModuleType):
    """The type of ``torch.tpu``: module properties and lazily resolved submodules."""

    _submodules: _Submodules

    @property
    def eager_mode(self) -> _modes.EagerMode:
        """The calling thread's eager mode; assign an ``EagerMode`` to change it (process-wide,
        or inside a thread-local ``torch_tpu.eager_mode(...)`` block that block's mode).
        TypeError for another type, RuntimeError inside a compiled region."""
        return _modes.get_eager_mode()

    @eager_mode.setter
    def eager_mode(self, mode: _modes.EagerMode) -> None:
        _modes.assign_eager_mode(mode)

    @property
    def allow_excess_precision(self) -> bool:
        """XLA's ``xla_allow_excess_precision`` (default True): whether 16-bit elementwise
        chains may keep float32 intermediates. A stored flag: the vTPU rounds 16-bit results
        once per ATen op in every mode (fused kernels included), which both settings allow, so
        no result changes (docs/design.md "Numerics"). TypeError for a non-bool."""
        return _modes.get_allow_excess_precision()

    @allow_excess_precision.setter
    def allow_excess_precision(self, value: bool) -> None:
        _modes.set_allow_excess_precision(value)

    @property
    def _initialized(self) -> bool:  # torch.cuda's name; set by `import torch_tpu`
        return _device._State.initialized

    @_initialized.setter
    def _initialized(self, value: bool) -> None:
        _device._State.initialized = bool(value)

    def __getattr__(self, name: str):
        # Only reached for names the module does not hold.
        if name in type(self)._submodules.table:
            return type(self)._submodules.load(name)
        raise AttributeError(f"module 'torch.tpu' has no attribute {name!r}")

    def __dir__(self):
        subs = type(self)._submodules
        present = {n for n in subs.table if subs.present(n)}
        return sorted(set(self.__dict__) | set(_PROPERTIES) | present)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import torch.tpu.<sub>`` gives the module ``torch_tpu.tpu.<sub>``. Without it Python
    would load the file a second time under the name ``torch.tpu.<sub>``, whose relative
    imports then point into ``torch``. Importing a submodule of the table that is missing
    (``import torch_tpu.tpu.pallas``, and ``from torch.tpu import pallas``, which Python
    resolves under the package's own name) raises its NotAvailableError."""

    def __init__(self, submodules: _Submodules):
        self.submodules = submodules
        self._real_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        own = self.submodules.package + "."
        if fullname.startswith(own):
            name = fullname[len(own):]
            if name in self.submodules.table and not self.submodules.present(name):
                raise self.submodules.error(name)
            return None
        if not fullname.startswith("torch.tpu."):
            return None
        rest = fullname[len("torch.tpu."):]
        head = rest.split(".")[0]
        if head in self.submodules.table and not self.submodules.present(head):
            raise self.submodules.error(head)
        # Only find here: loading the module now could make it enter sys.modules under
        # `fullname` (a module that aliases itself), and Python would then load its file again.
        real = f"{self.submodules.package}.{rest}"
        if real not in sys.modules and importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{self.submodules.package}.{spec.name[len('torch.tpu.'):]}")
        self._real_specs[spec.name] = module.__spec__  # Python overwrites it with the alias's
        return module

    def exec_module(self, module):
        # It ran under its own name; give it back its own spec.
        module.__spec__ = self._real_specs.pop(module.__spec__.name, module.__spec__)


def install(package: str, table: dict[str, tuple[str, str | None]]) -> None:
    """Give the module ``package`` (torch_tpu.tpu) the type :class:`TPUModule` with ``table``'s
    submodules, and alias ``import torch.tpu.<sub>`` to it (once per process)."""
    submodules = _Submodules(package, table)
    TPUModule._submodules = submodules
    sys.modules[package].__class__ = TPUModule
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(submodules))
