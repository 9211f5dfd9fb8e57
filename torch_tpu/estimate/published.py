"""Published training step times of public MaxText / tpu-recipes configurations, to check the
estimator against (docs/estimate.md shows them beside the estimates; the test suite fails when
an estimate leaves 15 % of them or says a published run does not fit).

Sources, pinned to the commits read:

- ``tiering``: MaxText's optimized-models tiering table, github.com/AI-Hypercomputer/maxtext,
  docs/reference/models/tiering.md at e591f30cbbf217ed67ef71263ec0538239f9c3b8 (MFU and
  tokens/s/device); the v5p Llama 2 70B row links benchmarks/maxtext_v5p_model_configs.py at
  92e59fdf547421f647590087f50fea5729da42d8 (``llama2_70b_v5p_128``: per-device batch 4,
  ``save_dot_except_mlpwi``, FSDP over the slice).
- ``recipes``: github.com/AI-Hypercomputer/tpu-recipes at c8cfe2f689081d36701a101cd73a70965d80926b,
  training/trillium/<model>/README.md and training/v5p/Llama3.1-405B-MaxText/README.md: the
  model configuration each README runs (per-device batch, remat policy and the tensors it
  offloads, FSDP, slices) and the step time its example log shows ("completed step: N,
  seconds: S, ...").
- ``ironwood``: the same tpu-recipes commit, training/ironwood/README.md (the TPU7x table: chips,
  global batch, step time, TFLOPs/s/chip, tokens/s/chip) and each recipe's run_recipe.sh (the
  MaxText arguments: per_device_batch_size per JAX device, two devices per TPU7x chip, remat
  policy and tensor placements, num_vocab_tiling).

Each row: ``name``, ``args`` (``python -m torch_tpu.estimate`` arguments reproducing the
configuration), ``generation``, ``step_s`` (published seconds per step at that batch),
``source`` and ``role``: ``build`` (looked at while building the estimator) or ``held_out``
(checked only after its constants were fixed).
"""

from __future__ import annotations

_T = "github.com/AI-Hypercomputer/tpu-recipes@c8cfe2f689081d36701a101cd73a70965d80926b:training/trillium/"
_L31_8B_OFFLOAD = ["--remat", "custom", "--offload", "decoder_layer_input,out_proj,query_proj,key_proj,value_proj"]
_I = "github.com/AI-Hypercomputer/tpu-recipes@c8cfe2f689081d36701a101cd73a70965d80926b:training/ironwood/"
# The TPU7x Llama 3.1 70B recipes: remat_policy custom with decoder_layer_input, context, query_proj,
# key_proj, value_proj (and the fused qkv_proj) on device.
_L31_70B_TPU7X = ["--remat", "custom", "--save", "decoder_layer_input,context,query_proj,key_proj,value_proj"]
_L31_70B_OFFLOAD = ["--remat", "custom", "--offload", "decoder_layer_input,query_proj,key_proj,value_proj"]


def _row(name, model, topology, batch, remat, step_s, source, role, generation, *extra):
    return {"name": name, "generation": generation, "step_s": step_s, "source": source, "role": role,
            "args": ["--model", model, "--topology", topology, "--batch", str(batch), *remat, *extra]}


PUBLISHED = [
    # MaxText tiering, v5p gold: 692 tokens/s/device at 512 chips x 4 x 4096 -> 2048*4096/512/692 s.
    _row("Llama 2 70B, v5p-1024 (512 chips)", "llama2-70b", "v5p-1024", 2048, ["--remat", "save_dot_except_mlpwi"],
         2048 * 4096 / 512 / 692, "maxtext@e591f30:docs/reference/models/tiering.md (v5p, 692 tokens/s/device); "
         "maxtext@92e59fd:benchmarks/maxtext_v5p_model_configs.py llama2_70b_v5p_128", "build", "v5p"),
    # The recipe's example log: "completed step: 16, seconds: 9.052, ... Tokens/s/device: 905.021,
    # total_weights: 2097152": 2097152 = 512 x 4096 tokens, so the logged run had 2 sequences per device
    # (the config block beside it says per_device_batch_size 3; the tiering's 900 tokens/s/device is
    # this log's 905). The row runs the logged batch and its step time.
    _row("Llama 2 70B, v6e-256", "llama2-70b", "v6e-256", 512, ["--remat", "qkv_proj_offloaded"],
         9.052, _T + "Llama2-70B-MaxText/README.md (llama2_70b_4096_sc; example log: 9.052 s, total_weights "
         "2097152); maxtext@e591f30:docs/reference/models/tiering.md (v6e, 900 tokens/s/device)", "build", "v6e"),
    _row("Llama 3.1 8B, v6e-256", "llama3-8b", "v6e-256", 1024, _L31_8B_OFFLOAD, 4.546,
         _T + "Llama3.1-8B-MaxText/v6e-256/README.md", "build", "v6e"),
    _row("Llama 3.1 8B, v6e-128", "llama3-8b", "v6e-128", 512, _L31_8B_OFFLOAD, 4.602,
         _T + "Llama3.1-8B-MaxText/v6e-128/README.md", "held_out", "v6e"),
    _row("Llama 3.1 8B, v6e-64", "llama3-8b", "v6e-64", 320, _L31_8B_OFFLOAD, 5.652,
         _T + "Llama3.1-8B-MaxText/v6e-64/README.md", "held_out", "v6e"),
    _row("Llama 3.1 8B, v6e-32", "llama3-8b", "v6e-32", 96, _L31_8B_OFFLOAD, 3.495,
         _T + "Llama3.1-8B-MaxText/v6e-32/README.md", "held_out", "v6e"),
    _row("Llama 3.1 8B, v6e-8", "llama3-8b", "v6e-8", 24, _L31_8B_OFFLOAD, 3.443,
         _T + "Llama3.1-8B-MaxText/v6e-8/README.md", "held_out", "v6e"),
    _row("Llama 3.1 70B, v6e-256", "llama3-70b", "v6e-256", 1280, _L31_70B_OFFLOAD, 42.656,
         _T + "Llama3.1-70B-MaxText/v6e-256/README.md", "build", "v6e"),
    _row("Llama 3.1 70B, v6e-128", "llama3-70b", "v6e-128", 512, _L31_70B_OFFLOAD, 34.786,
         _T + "Llama3.1-70B-MaxText/v6e-128/README.md", "held_out", "v6e"),
    _row("Llama 3.1 70B, v6e-64", "llama3-70b", "v6e-64", 128, _L31_70B_OFFLOAD, 18.688,
         _T + "Llama3.1-70B-MaxText/v6e-64/README.md", "held_out", "v6e"),
    # llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul: weight_dtype bfloat16.
    _row("Llama 3.1 70B, v6e-32", "llama3-70b", "v6e-32", 64, _L31_70B_OFFLOAD, 17.790,
         _T + "Llama3.1-70B-MaxText/v6e-32/README.md", "held_out", "v6e", "--weight-dtype", "bf16"),
    # llama3_1_405b_8192_pure_fsdp_ici: ici_fsdp 256 x dcn_fsdp 2, FSDP over both slices (DCN).
    _row("Llama 3.1 405B, 2 x v6e-256", "llama3-405b", "v6e-256", 512,
         ["--remat", "custom", "--offload", "decoder_layer_input"], 54.803,
         _T + "Llama3.1-405B-MaxText/README.md", "held_out", "v6e", "--slices", "2", "--dp", "1"),
    _row("Llama 3.1 405B, v5p-1024 (512 chips)", "llama3-405b", "v5p-1024", 1024,
         ["--remat", "custom", "--offload", "context,mlpwo"], 131.474,
         "github.com/AI-Hypercomputer/tpu-recipes@c8cfe2f689081d36701a101cd73a70965d80926b:"
         "training/v5p/Llama3.1-405B-MaxText/README.md; maxtext@e591f30:benchmarks/maxtext_v5p_model_configs.py "
         "llama3_1_405b_8192_v5p_1024 (num_vocab_tiling 4)", "held_out", "v5p", "--loss-chunks", "4"),
    # TPU7x (Ironwood): tpu-recipes' training/ironwood/README.md table (step time, chips, GBS) and each
    # recipe's run_recipe.sh (MaxText arguments). Chips, not devices: a TPU7x chip is two JAX devices
    # (per_device_batch_size 2 x 128 devices = GBS 256 on 64 chips), so the chip's batch is GBS / chips.
    # The recipes' mu_dtype=bfloat16: AdamW's first moment in bf16 (--mu-dtype bf16).
    _row("Llama 3.1 70B, tpu7x-128 (64 chips)", "llama3-70b", "tpu7x-128", 256, _L31_70B_TPU7X, 12.20,
         _I + "README.md (llama3.1-70b, 64 chips, GBS 256, bf16: 12.20 s); "
         + _I + "llama3.1-70b/8k-bf16-tpu7x-4x4x4/xpk/run_recipe.sh", "held_out", "tpu7x", "--mu-dtype", "bf16"),
    _row("Llama 3.1 70B, tpu7x-512 (256 chips)", "llama3-70b", "tpu7x-512", 1024, _L31_70B_TPU7X, 12.27,
         _I + "README.md (llama3.1-70b, 256 chips, GBS 1024, bf16: 12.27 s); "
         + _I + "llama3.1-70b/8k-bf16-tpu7x-4x8x8/xpk/run_recipe.sh", "held_out", "tpu7x", "--mu-dtype", "bf16"),
    _row("Llama 3.1 405B, tpu7x-512 (256 chips)", "llama3-405b", "tpu7x-512", 1536,
         ["--remat", "custom", "--offload", "decoder_layer_input,mlpwo", "--save", "key_proj,value_proj"], 98.34,
         _I + "README.md (llama3.1-405b, 256 chips, GBS 1536, bf16: 98.34 s); "
         + _I + "llama3.1-405b/8k-bf16-tpu7x-4x8x8/run_recipe.sh (num_vocab_tiling 4)", "held_out", "tpu7x",
         "--loss-chunks", "4", "--mu-dtype", "bf16"),
]
