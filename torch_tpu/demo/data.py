"""The demo's corpus: Python source files, byte-level tokens, a train/validation split by file.

Tokens are bytes (vocabulary 256). A file goes to the validation split when the
first two bytes of SHA-256 of its relative path (POSIX separators), read as an
integer in [0, 65536), fall below ``val_fraction * 65536``: the split depends
only on the path, never on the walk order, the machine or the run.

Batches are drawn from ``(seed, step)`` alone, so a resumed run sees the same
data as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np
import torch

from .._units import format_bytes

# Directories of the standard library tree that are not the standard library's own source.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


class CorpusError(ValueError):
    """The corpus path is missing, unreadable or holds no usable text."""


def default_corpus() -> str:
    """The Python standard library's source directory (``sysconfig.get_paths()["stdlib"]``)."""
    return sysconfig.get_paths()["stdlib"]


def list_source_files(root: str) -> list[str]:
    """Relative POSIX paths of the ``*.py`` files under ``root``, sorted.

    Skips ``site-packages``, ``dist-packages`` and ``__pycache__`` (installed
    third-party code is not the standard library). Raises CorpusError when ``root``
    does not exist, is not a directory or holds no ``*.py`` file.
    """
    if not os.path.exists(root):
        raise CorpusError(f"corpus path {root!r} does not exist")
    if not os.path.isdir(root):
        raise CorpusError(f"corpus path {root!r} is not a directory (expected a folder of *.py files)")
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for f in filenames:
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    if not out:
        raise CorpusError(f"corpus path {root!r} holds no *.py files")
    return sorted(out)


def is_validation(rel_path: str, val_fraction: float) -> bool:
    """True when ``rel_path`` belongs to the validation split (deterministic hash of the path)."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:2], "big")
    return h < val_fraction * 65536


def split_files(paths: list[str], val_fraction: float) -> tuple[list[str], list[str]]:
    """``(train, val)`` lists of relative paths, each in the order of ``paths``.

    When the hash puts every file on one side (tiny corpora), the last file (in
    sorted order) of the larger side moves over so that both splits are non-empty;
    a corpus of one file raises CorpusError.
    """
    if len(paths) < 2:
        raise CorpusError(f"the corpus needs at least 2 *.py files for a train/validation split, found {len(paths)}")
    val = [p for p in paths if is_validation(p, val_fraction)]
    train = [p for p in paths if not is_validation(p, val_fraction)]
    if not val:
        val.append(train.pop())
    elif not train:
        train.append(val.pop())
    return train, val


def unigram_entropy_nats(tokens: np.ndarray) -> float:
    """Entropy, in nats per byte, of the byte distribution of ``tokens`` (uint8 [N]).

    ``H = -sum_b p(b) ln p(b)`` with ``p(b) = count(b) / N``, over bytes that occur.
    It is the loss of the best model that ignores context: a language model has
    learned something once its loss is well below it.
    """
    counts = np.bincount(tokens, minlength=256).astype(np.float64)
    n = counts.sum()
    if n == 0:
        raise CorpusError("cannot compute the entropy of an empty token stream")
    p = counts[counts > 0] / n
    return float(-(p * np.log(p)).sum())


@dataclass
class Corpus:
    """Both splits as byte streams (uint8 tensors on the host) and what they came from."""

    root: str
    train_files: list[str]
    val_files: list[str]
    train: torch.Tensor  # uint8 [N_train]: the train files concatenated, in sorted path order
    val: torch.Tensor  # uint8 [N_val]
    unigram_nats: float  # entropy of the train split's byte distribution, nats per byte

    def describe(self) -> str:
        return (f"corpus {self.root}: {len(self.train_files)} train files ({format_bytes(self.train.numel())}), "
                f"{len(self.val_files)} validation files ({format_bytes(self.val.numel())}), "
                f"byte unigram entropy {self.unigram_nats:.3f} nats")


def _read_concat(root: str, files: list[str]) -> np.ndarray:
    chunks = []
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            chunks.append(f.read())
    return np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()


def load_corpus(root: str | None = None, val_fraction: float = 0.05, min_tokens: int = 2) -> Corpus:
    """Read every ``*.py`` file under ``root`` (default: the standard library) into two byte streams.

    ``min_tokens``: each split must hold more than this many bytes (a window of
    ``seq_len + 1`` tokens); raises CorpusError otherwise, or when the path is missing
    or holds no source.
    """
    root = os.path.abspath(root or default_corpus())
    train_files, val_files = split_files(list_source_files(root), val_fraction)
    train, val = _read_concat(root, train_files), _read_concat(root, val_files)
    for name, arr in (("train", train), ("validation", val)):
        if arr.size <= min_tokens:
            raise CorpusError(f"corpus {root!r}: the {name} split has {arr.size} bytes; "
                              f"need more than {min_tokens} (one window of --seq-len + 1 tokens)")
    return Corpus(root, train_files, val_files, torch.from_numpy(train), torch.from_numpy(val),
                  unigram_entropy_nats(train))


def batch_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator seeded from ``(seed, step, stream)`` only (stream 0: training, 1: validation)."""
    digest = hashlib.sha256(f"{seed}/{stream}/{step}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def get_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``tokens`` (uint8 [N]): inputs and next-token targets.

    Returns ``(x, y)``, int64 [batch_size, seq_len] each, on the host, with
    ``y[:, t] = x[:, t + 1]`` within one window of ``seq_len + 1`` bytes.
    """
    n = tokens.numel() - seq_len - 1
    if n < 1:
        raise CorpusError(f"a split of {tokens.numel()} bytes is too short for --seq-len {seq_len}")
    starts = torch.randint(0, n, (batch_size,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # [B, T+1]
    win = tokens[idx].long()
    return win[:, :-1].contiguous(), win[:, 1:].contiguous()


def train_batch(corpus: Corpus, batch_size: int, seq_len: int, seed: int, step: int):
    """The training batch of ``step`` (0-based): a function of ``(seed, step)`` alone."""
    return get_batch(corpus.train, batch_size, seq_len, batch_generator(seed, step, 0))


def val_batches(corpus: Corpus, n_batches: int, batch_size: int, seq_len: int, seed: int):
    """The fixed validation set: ``n_batches`` batches, identical at every evaluation."""
    return [get_batch(corpus.val, batch_size, seq_len, batch_generator(seed, i, 1)) for i in range(n_batches)]


def decode(tokens) -> str:
    """Bytes (a sequence of ints in [0, 256)) to text; invalid UTF-8 becomes U+FFFD."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


