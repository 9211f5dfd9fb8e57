"""The torch_tpu version (a module of its own, so submodules read it without importing the package first)."""

__version__ = "0.1.0"
