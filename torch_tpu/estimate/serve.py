"""``python -m torch_tpu.estimate --serve``: the cost model's serving figures for one chip.

One model replica per chip (no tensor parallelism here). Dry-runs on tpu, priced with the
same op costs as the training estimate (``torch_tpu.runtime.stats()``'s
``device_bound_by_generation``):

- a **prefill step**: ``batch`` prompts of ``prefill_len`` tokens through the model, logits
  of the last position only (as vLLM computes them);
- a **decode step**: ``batch`` sequences of one new token each, every layer attending a
  ``context``-token KV cache: the fused attention kernel the training estimate prices, with
  the ``H / kv_heads`` queries of each KV head over its ``[B, kv_heads, context, D]`` keys and
  values (each cache byte read once from HBM, as a paged-attention kernel does).

Per generation: both step times, tokens/s per chip (prefill: ``batch x prefill_len`` / step;
decode: ``batch`` / step), and the KV-cache blocks that fit:
``(gpu_memory_utilization x HBM - weights) / (block_size x 2 x layers x kv_heads x head_dim x
dtype bytes)``, with HBM the generation's physical capacity.
"""

from __future__ import annotations

import torch

import torch_tpu.runtime

from . import models as M
from .core import GENERATIONS, ModelSpec, dry_run


def _shape(spec: ModelSpec) -> dict:
    if spec.kind == "llama":
        c = spec.llama
        return {"layers": c.n_layers, "heads": c.n_heads, "kv_heads": c.n_kv_heads, "head_dim": c.head_dim,
                "params": c.num_params()}
    if spec.kind == "gpt":
        preset = M.GPT_PRESETS[spec.gpt_preset]
        d = preset["d_model"] // preset["n_head"]
        return {"layers": preset["n_layer"], "heads": preset["n_head"], "kv_heads": preset["n_head"], "head_dim": d}
    raise ValueError("--serve: estimates Llama-style models and the demo's GPT (gpt-*), not factories")


def _last_logits(model: torch.nn.Module, spec: ModelSpec, idx: torch.Tensor) -> torch.Tensor:
    """The model's forward up to the logits of the last position: ``idx [B, T]`` -> ``[B, V]``."""
    B, T = idx.shape
    if spec.kind == "llama":
        x = model.embed(idx)
        freqs = torch.outer(torch.arange(T, dtype=torch.float32), model._inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1).to(idx.device)
        cos, sin = emb.cos(), emb.sin()
        for layer in model.layers:
            x = layer(x, cos, sin)
        return model.head.output(model.head.norm(x[:, -1]))
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(T, device=idx.device))
    for block in model.blocks:
        x = block(x)
    return model.head(model.ln_f(x[:, -1]))


def _priced(fn, device: int) -> dict:
    torch.tpu.synchronize(device)
    torch_tpu.runtime.reset_stats(device)
    fn()
    torch.tpu.synchronize(device)
    bound = torch_tpu.runtime.stats(device)["device_bound_by_generation"]
    return {g: float(bound[g]["total"]) for g in GENERATIONS}


def serve_estimate(spec: ModelSpec, *, batch: int, prefill_len: int, context: int, block_size: int = 16,
                   gpu_memory_utilization: float = 0.9, dtype: str = "bf16", device: int = 0) -> dict:
    """Serving figures per generation (see the module docstring). Raises ValueError for bad sizes."""
    for what, v in (("batch", batch), ("prefill_len", prefill_len), ("context", context), ("block_size", block_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"--serve: {what} must be a positive integer, got {v!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"--serve: gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"--serve: dtype must be 'bf16' or 'fp32', got {dtype!r}")
    if spec.kind == "gpt" and max(prefill_len, context) > spec.seq_len:
        raise ValueError(f"--serve: the demo GPT's context is its --seq-len {spec.seq_len} (learned positions); "
                         f"got prefill {prefill_len}, context {context}")
    shape = _shape(spec)
    wdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    dev = torch.device("tpu", device)
    with dry_run():
        with torch.device("meta"):
            model = (M.Llama(spec.llama) if spec.kind == "llama" else M.demo_gpt(spec.gpt_preset,
                                                                                seq_len=spec.seq_len))
        model.to_empty(device=dev)
        model.to(wdtype)
        params = sum(p.numel() for p in model.parameters())
        H, D, L = shape["heads"], shape["head_dim"], shape["layers"]
        with torch.no_grad():
            prefill = _priced(lambda: _last_logits(model, spec, torch.zeros(batch, prefill_len, dtype=torch.int64,
                                                                            device=dev)), device)
            # GQA decode as a paged-attention kernel runs it: the H / kv_heads queries of a KV head
            # together over that head's cache, read once (the training estimate's fused kernel).
            K = shape["kv_heads"]
            q = torch.empty(batch, K, H // K, D, dtype=wdtype, device=dev)
            kv = torch.empty(batch, K, context, D, dtype=wdtype, device=dev)

            def decode():
                _last_logits(model, spec, torch.zeros(batch, 1, dtype=torch.int64, device=dev))
                for _ in range(L):
                    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, kv, kv, 0.0, False)

            decode_s = _priced(decode, device)
    weight_bytes = params * (2 if dtype == "bf16" else 4)
    block_bytes = block_size * 2 * L * shape["kv_heads"] * D * (2 if dtype == "bf16" else 4)
    specs = {g["generation"]: g for g in torch_tpu.runtime.generations()}
    by_gen = {}
    for g in GENERATIONS:
        budget = int(specs[g]["hbm_bytes"] * gpu_memory_utilization) - weight_bytes
        by_gen[g] = {
            "prefill_step_s": prefill[g],
            "decode_step_s": decode_s[g],
            "prefill_tokens_per_s_per_chip": batch * prefill_len / prefill[g],
            "decode_tokens_per_s_per_chip": batch / decode_s[g],
            "kv_blocks": max(0, budget // block_bytes),
            "kv_tokens": max(0, budget // block_bytes) * block_size,
            "fits_batch": budget >= batch * -(-context // block_size) * block_bytes,
        }
    return {"model": spec.name, "params": params, "batch": batch, "prefill_len": prefill_len, "context": context,
            "block_size": block_size, "kv_block_bytes": block_bytes, "weight_bytes": weight_bytes,
            "gpu_memory_utilization": gpu_memory_utilization, "dtype": dtype, "by_generation": by_gen}


def format_serve_table(r: dict) -> str:
    """The readable report of :func:`serve_estimate`."""
    lines = [f"{r['model']}: {r['params'] / 1e6:.2f} M parameters ({r['dtype']}), batch {r['batch']}, prefill "
             f"{r['prefill_len']} tokens, decode over a {r['context']}-token context; KV blocks of "
             f"{r['block_size']} tokens ({r['kv_block_bytes']} bytes), {r['gpu_memory_utilization']:.0%} of HBM",
             "per chip, estimated (cost model):",
             f"  {'gen':<6} {'prefill ms':>11} {'decode ms':>10} {'prefill tok/s':>14} {'decode tok/s':>13} "
             f"{'KV blocks':>11}  fits batch"]
    for g, e in r["by_generation"].items():
        lines.append(f"  {g:<6} {e['prefill_step_s'] * 1e3:>11.3f} {e['decode_step_s'] * 1e3:>10.3f} "
                     f"{e['prefill_tokens_per_s_per_chip']:>14.0f} {e['decode_tokens_per_s_per_chip']:>13.0f} "
                     f"{e['kv_blocks']:>11}  {'yes' if e['fits_batch'] else 'NO'}")
    return "\n".join(lines)
