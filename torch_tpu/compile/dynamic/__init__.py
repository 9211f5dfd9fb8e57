"""Bounded dynamism for ``torch.compile(backend="tpu")``: dynamic dimensions padded to buckets.

When Dynamo hands the backend a graph with symbolic sizes (``dynamic=True``, or the
automatic-dynamic recompile after a size changed), :func:`compile_bucketed` compiles it
once per *bucket* instead of once per size. Each call

1. reads the true value of every dynamic dimension (sequence length, batch, ...) from the
   inputs and rounds it up to its bucket (default: powers of two up to 128, then multiples
   of 128; see :func:`set_buckets` and ``TORCH_TPU_COMPILE_BUCKETS``);
2. pads the tensor inputs with zeros to the bucket sizes (``torch.nn.functional.pad``, so
   autograd flows back through the padding);
3. runs the bucket's program, compiled once by the static pipeline (``compile_static``) from
   a rewritten graph with the bucket's static shapes and one extra input per dynamic
   dimension: its true length, a 0-dim ``int64`` tensor;
4. slices every output back to its true sizes.

The rewritten graph carries *masks*: for every intermediate tensor, a boolean tensor
(broadcastable to it) that is true on entries derived from real, unpadded data. Before any
op that mixes entries along a padded dimension the padded entries are replaced by the op's
identity: ``sum``/``mean``/matmul contractions see ``0`` (``mean`` divides by the true
count), ``amax``/softmax/log-softmax see the dtype's lowest value (so attention over padded
keys gets weight exactly 0 and fully padded rows stay finite, keeping gradients free of
NaN), ``nll_loss`` sees ``ignore_index`` on padded positions. Elementwise ops, views,
permutes and matmuls on non-contracted dims just carry masks along. So one program serves
every length of its bucket and returns what the unpadded computation returns.

What the masking cannot prove safe falls back, with the reason recorded in
``torch_tpu.compile_stats()["recompile_reasons"]`` and :func:`bucket_stats`: a size whose
padding is at fault (layer norm over it, ``x[:, -1]``) stays exact while the others are
still bucketed; otherwise (an op without a masking rule on a padded dim, a size used as a
value, a write into a padded input, ``detach`` / ``no_grad`` / a custom autograd.Function
when gradients are needed: the bucket's ATen trace runs below autograd) Dynamo's own graph
is compiled for each exact shape.

Modules, by job: :mod:`.config` (bucket sizes), :mod:`.analysis` (what a Dynamo graph
allows), :mod:`.retrace` and :mod:`.decompositions` (the static ATen trace of a bucket),
:mod:`.mask` (masks as graph nodes), :mod:`.masking` (the pass, and its op -> rule table
over :mod:`.shape_rules`, :mod:`.reduction_rules`, :mod:`.carry_rules`), :mod:`.padding`
(padding inputs, slicing outputs) and :mod:`.bucketed` (:func:`compile_bucketed`). Its
counters live with the backend's, in :mod:`torch_tpu.compile.stats`.
"""

from ..stats import bucket_stats, reset_bucket_stats
from .bucketed import compile_bucketed
from .config import DEFAULT_SPEC, ENV_VAR, BucketConfig, get_buckets, parse_buckets, set_buckets

__all__ = ["compile_bucketed", "set_buckets", "get_buckets", "parse_buckets", "BucketConfig",
           "bucket_stats", "reset_bucket_stats", "ENV_VAR", "DEFAULT_SPEC"]
