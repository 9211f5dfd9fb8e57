"""vLLM's offline ``LLM`` API on the tpu platform: greedy token ids equal ``transformers`` on CPU.

Oracle: ``transformers`` greedy ``generate`` in float32 on CPU (helpers/serving.py), each
continuation cut before its first near-tie (top-2 logits within 1e-4). Model: the demo GPT
(trained for a few seconds, exported as GPT-2 with the byte tokenizer), prefix caching on;
test_vllm_llama.py has a Llama without prefix caching.
The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on tpu:0; the
KV cache is kept small with ``num_gpu_blocks_override`` except in the capacity test.
"""

import gc
import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from helpers.serving import demo_gpt_checkpoint, hf_greedy, prefix_match, tokenize  # noqa: E402

N_NEW = 16
HBM_FRACTION = 0.002
GPT_PROMPTS = ["def __init__(self", "import os\nimport sys\n", "    return", "class Text", "for i in range(", "#"]


def _llm(path, **kw):
    from vllm import LLM

    return LLM(
        model=path, dtype="float32", enforce_eager=True, max_num_seqs=8, max_num_batched_tokens=256, seed=0, **kw
    )


def _close(llm):
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def _greedy(llm, prompts, n=N_NEW):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    path = demo_gpt_checkpoint(str(tmp_path_factory.mktemp("demo_gpt")))
    prompts = tokenize(path, GPT_PROMPTS)
    ref = hf_greedy(path, prompts, N_NEW)
    before = torch.tpu.memory_stats(0)["allocated_bytes.all.current"]
    # KV cache from HBM: 0.2 % of the chip's capacity (v6e: 32 GiB -> ~69 MB; never touched whole).
    llm = _llm(path, enable_prefix_caching=True, gpu_memory_utilization=HBM_FRACTION)
    yield llm, prompts, ref, before
    _close(llm)


def _check(got, ref):
    assert all(len(r) >= 4 for r in ref), f"oracle continuations cut short by near-ties: {ref}"
    for g, r in zip(got, ref):
        assert prefix_match(g, r), (g, r)


def test_gpt_single_and_batched_with_prefix_caching(gpt):
    llm, prompts, ref, _ = gpt
    _check(_greedy(llm, prompts[:1]), ref[:1])
    _check(_greedy(llm, prompts), ref)  # ragged batch: prefills of 1..20 tokens together
    # Same prompts again: their full blocks (16 tokens) now come from the prefix cache.
    _check(_greedy(llm, prompts), ref)


def test_gpt_prefix_cache_hits_and_continuous_batching(gpt):
    llm, prompts, ref, _ = gpt
    # A long shared prefix (two full blocks) then different tails: the second request reuses the blocks.
    base = (prompts[1] * 2)[:32]
    longp = [base + p[:4] for p in prompts[:3]]  # 36 tokens + 16 new <= max_model_len 64
    want = hf_greedy(llm.llm_engine.model_config.model, longp, N_NEW)
    for p, w in zip(longp, want):  # one at a time: the 2nd and 3rd hit the blocks the 1st filled
        _check(_greedy(llm, [p]), [w])
    _check(_greedy(llm, longp), want)  # and together


def test_gpt_seeded_sampling_reproducible(gpt):
    from vllm import SamplingParams

    llm, prompts, _, _ = gpt
    sp = SamplingParams(temperature=1.0, top_k=20, max_tokens=12, seed=1234, ignore_eos=True)
    a = [
        o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], sp, use_tqdm=False)
    ]
    b = [
        o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts[:3]], sp, use_tqdm=False)
    ]
    assert a == b
    greedy = _greedy(llm, prompts[:3], 12)
    assert a != greedy  # it did sample


def test_gpt_kv_cache_blocks_from_hbm(gpt):
    from vllm.platforms import current_platform

    from torch_tpu.serving.worker import activation_reserve_bytes

    llm, _, _, before = gpt
    cfg = llm.llm_engine.vllm_config
    assert (current_platform.device_type, current_platform.dispatch_key, current_platform.dist_backend) == (
        "tpu",
        "PrivateUse1",
        "tpu_dist",
    )
    assert cfg.model_config.max_model_len == 64  # the demo's --seq-len (learned positions)
    # Bytes per block: layers x (K + V) x block_size x kv heads x head size x float32.
    block_bytes = 2 * 2 * cfg.cache_config.block_size * 4 * 16 * 4
    budget = int(torch.tpu.get_device_properties(0).total_memory * HBM_FRACTION) - activation_reserve_bytes(cfg)
    blocks = cfg.cache_config.num_gpu_blocks
    after = torch.tpu.memory_stats(0)["allocated_bytes.all.current"]
    assert after - before >= blocks * block_bytes  # torch.tpu.memory_stats() shows the cache
    weights = after - before - blocks * block_bytes  # weights and the runner's buffers
    assert (budget - weights - before) // block_bytes - 1 <= blocks <= budget // block_bytes


def test_gpt_prompt_beyond_max_model_len(gpt):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    llm, prompts, ref, _ = gpt
    with pytest.raises(VLLMValidationError, match="maximum context length is 64 tokens.*80 input tokens"):
        llm.generate([{"prompt_token_ids": [65] * 80}], SamplingParams(max_tokens=4), use_tqdm=False)
    _check(_greedy(llm, prompts[:2]), ref[:2])  # still serving
