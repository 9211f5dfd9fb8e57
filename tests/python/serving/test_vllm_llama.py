"""vLLM on tpu, a Llama (RoPE, RMSNorm, SwiGLU, GQA) with MiniLM's WordPiece tokenizer.

Oracle as in test_vllm_offline.py: ``transformers`` greedy on CPU in float32, cut at near-ties.
Prefix caching off here; special tokens pinned off (``add_special_tokens=False``).
"""

import os

import pytest

pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from helpers.serving import hf_greedy, llama_checkpoint, prefix_match, tokenize  # noqa: E402

PROMPTS = ["the quick brown fox", "hello world, this is a test of", "serving", "a b c d e f g h i j k l m n o p q r"]
N_NEW = 16


def test_llama_minilm_greedy_without_prefix_caching(tmp_path):
    import gc

    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    path = llama_checkpoint(str(tmp_path / "llama"))
    prompts = tokenize(path, PROMPTS)
    assert all(101 not in p and 102 not in p for p in prompts)  # no [CLS]/[SEP]
    ref = hf_greedy(path, prompts, N_NEW)
    assert all(len(r) >= 4 for r in ref), ref
    llm = LLM(
        model=path,
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        seed=0,
        enable_prefix_caching=False,
        num_gpu_blocks_override=32,
    )
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
        single = llm.generate([{"prompt_token_ids": prompts[0]}], sp, use_tqdm=False)
        assert prefix_match(single[0].outputs[0].token_ids, ref[0])
        batch = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        for o, r in zip(batch, ref):
            assert prefix_match(o.outputs[0].token_ids, r), (o.outputs[0].token_ids, r)
        text = llm.generate(PROMPTS[:1], sp, use_tqdm=False)  # the tokenizer inside vLLM: same ids
        assert text[0].prompt_token_ids[1:-1] == prompts[0] or text[0].prompt_token_ids == prompts[0]
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
