"""TorchTitan model flavors for tpu runs, registered through ``--experimental.custom-import tpu_flavors``.

TorchTitan 0.2.2 looks a ``--model.flavor`` up in its llama3 registry (``llama3_args``); this module
adds ``tpu_smoke`` to it: the ``debugmodel_flex_attn`` architecture (flex attention, document-causal
masks) shrunk to 2 layers of width 64 so that a test step takes seconds on the vTPU. TorchTitan's
files are not modified: ``--experimental.custom-import`` is its hook for user registrations.
"""

from torchtitan.models.llama3 import TransformerModelArgs, llama3_args

SMOKE = "tpu_smoke"

llama3_args.setdefault(
    SMOKE,
    TransformerModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        vocab_size=2048,
        rope_theta=500000,
        attn_type="flex",
        attn_mask_type="block_causal",
    ),
)
