"""Private paths that other projects import from TorchTPU (Helion, TorchRec, Ray; see
docs/design.md). Nothing here is public API: each module offers exactly what those callers use."""
