"""Tensor parallel vLLM on tpu: 2 chips of one host through ``tpu_dist``, greedy equal to 1 chip.

vLLM's multiprocessing executor starts one worker per chip (``tpu:0``, ``tpu:1``); the
column/row-parallel layers all-reduce and all-gather over the ``tpu_dist`` device group.
Oracle: ``transformers`` greedy on CPU in float32 (which the 1-chip engine matches in
test_vllm_offline.py), cut at near-ties.
"""

import pytest

pytest.importorskip("vllm")

from helpers.serving import demo_gpt_checkpoint, hf_greedy, prefix_match, tokenize  # noqa: E402

PROMPTS = ["def __init__(self", "import os\nimport sys\n", "    return", "class Text"]


def test_tensor_parallel_2_greedy_equals_one_chip(tmp_path):
    import gc

    from vllm import LLM, SamplingParams

    path = demo_gpt_checkpoint(str(tmp_path / "gpt"))  # 4 heads: 2 per chip
    prompts = tokenize(path, PROMPTS)
    ref = hf_greedy(path, prompts, 16)
    assert all(len(r) >= 4 for r in ref), ref
    llm = LLM(model=path, dtype="float32", enforce_eager=True, tensor_parallel_size=2, num_gpu_blocks_override=48,
              max_num_seqs=8, max_num_batched_tokens=256, distributed_executor_backend="mp")
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        for o, r in zip(outs, ref):
            assert prefix_match(o.outputs[0].token_ids, r), (o.outputs[0].token_ids, r)
    finally:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
