"""Padding jagged NestedTensors to a token count that is a multiple of a block size, and back.

Semantics (ours; TorchTPU's signatures only): a jagged NestedTensor ``nt`` of ``B``
sequences holds its tokens packed in ``nt.values()`` (``[T, ...]``) with ``nt.offsets()``
(``[B + 1]``). :func:`align_jagged_to_multiple` appends **one** padding sequence of
``(-T) % multiple`` tokens (possibly empty) filled with ``padding_value``, so the result has
``B + 1`` sequences and ``ceil(T / multiple) * multiple`` tokens: the packed buffer's length
is a multiple of ``multiple`` (a static, tile-aligned size for compiled programs), the batch
size is always ``B + 1``, and no real sequence changes length, so per-sequence ops
(attention over the jagged dim, reductions per sequence) see the padding only in the padding
sequence. :func:`strip_jagged_padding` removes it again.
"""

from __future__ import annotations

import torch

__all__ = ["align_jagged_to_multiple", "strip_jagged_padding"]


def _check_jagged(op: str, nt) -> None:
    if not isinstance(nt, torch.Tensor) or not nt.is_nested:
        raise TypeError(f"{op}: nt must be a NestedTensor with layout=torch.jagged, got "
                        f"{type(nt).__name__ if not isinstance(nt, torch.Tensor) else 'a dense Tensor'}")
    if nt.layout != torch.jagged:
        raise TypeError(f"{op}: nt must have layout=torch.jagged, got {nt.layout} (convert with "
                        "torch.nested.nested_tensor(list(nt.unbind()), layout=torch.jagged))")
    if getattr(nt, "_ragged_idx", 1) != 1:
        raise NotImplementedError(f"{op}: only NestedTensors whose ragged dim is 1 ([B, j, ...]) are supported, "
                                  f"nt's ragged dim is {nt._ragged_idx}")
    if nt.lengths() is not None:
        raise NotImplementedError(f"{op}: nt has holes (lengths as well as offsets, e.g. from narrow()); "
                                  "make it contiguous first (nt.contiguous())")


def align_jagged_to_multiple(nt: torch.Tensor, multiple: int = 128,
                             padding_value: float | int | bool = 0.0) -> torch.Tensor:
    """Pad a jagged NestedTensor's packed tokens to a multiple of ``multiple`` (see module doc).

    ``nt``: jagged NestedTensor ``[B, j, ...]`` (ragged dim 1, no holes). Returns a jagged
    NestedTensor ``[B + 1, j', ...]`` whose ``values()`` are ``nt.values()`` followed by
    ``(-T) % multiple`` rows of ``padding_value`` (``T = nt.values().shape[0]``) forming the
    last sequence; the first ``B`` sequences are ``nt``'s. Differentiable in ``nt``; nothing
    is read back to the host. Raises TypeError for a dense or strided ``nt``, ValueError for
    ``multiple < 1``, NotImplementedError for another ragged dim or a NestedTensor with holes.
    """
    op = "align_jagged_to_multiple"
    _check_jagged(op, nt)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError(f"{op}: multiple must be a positive int, got {multiple!r}")
    values, offsets = nt.values(), nt.offsets()
    pad = (-values.shape[0]) % multiple
    padding = values.new_full((pad, *values.shape[1:]), padding_value)
    new_offsets = torch.cat([offsets, offsets[-1:] + pad])
    return torch.nested.nested_tensor_from_jagged(torch.cat([values, padding]), new_offsets)


def strip_jagged_padding(nt: torch.Tensor, valid_tokens: int | None = None) -> torch.Tensor:
    """Undo :func:`align_jagged_to_multiple`: drop the trailing padding sequence.

    ``nt``: jagged NestedTensor ``[B + 1, j, ...]`` whose last sequence is padding. Returns
    ``[B, j, ...]`` holding the first ``B`` sequences. With ``valid_tokens=None`` the padding's
    start (``nt.offsets()[-2]``) is read on the host (a synchronization); pass
    ``valid_tokens`` (the real token count ``T`` before alignment) to avoid it: the result then
    keeps the first ``valid_tokens`` packed tokens, with offsets clamped to it (equal to the
    ``None`` result when ``valid_tokens`` is right). Differentiable in ``nt``. Raises
    TypeError/NotImplementedError as :func:`align_jagged_to_multiple`, ValueError for an
    ``nt`` of one sequence or a ``valid_tokens`` outside ``[0, nt.values().shape[0]]``.
    """
    op = "strip_jagged_padding"
    _check_jagged(op, nt)
    values, offsets = nt.values(), nt.offsets()
    if offsets.shape[0] < 3:
        raise ValueError(f"{op}: nt has {offsets.shape[0] - 1} sequence(s); it needs a real one besides the padding")
    total = values.shape[0]
    if valid_tokens is None:
        end = int(offsets[-2].item())
        return torch.nested.nested_tensor_from_jagged(values[:end], offsets[:-1])
    if isinstance(valid_tokens, bool) or not isinstance(valid_tokens, int) or not 0 <= valid_tokens <= total:
        raise ValueError(f"{op}: valid_tokens must be an int in [0, {total}] (nt's packed tokens), "
                         f"got {valid_tokens!r}")
    return torch.nested.nested_tensor_from_jagged(values[:valid_tokens], offsets[:-1].clamp(max=valid_tokens))
