"""Tensor parallel vLLM on tpu: 2 chips of one host through ``tpu_dist``, greedy equal to 1 chip.

vLLM's multiprocessing executor starts one worker per chip (``tpu:0``, ``tpu:1``); the
column/row-parallel layers all-reduce and all-gather over the ``tpu_dist`` device group.
Oracle: ``transformers`` greedy on CPU in float32 (which the 1-chip engine matches in
test_vllm_offline.py), cut at near-ties. The engine runs in a fresh process (its own engine
core process and workers, as deployed), not in the test process.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from helpers.paths import REPO_ROOT  # noqa: E402
from helpers.serving import demo_gpt_checkpoint, hf_greedy, prefix_match, tokenize  # noqa: E402

PROMPTS = ["def __init__(self", "import os\nimport sys\n", "    return", "class Text"]

SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
path, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model=path, dtype="float32", enforce_eager=True, tensor_parallel_size=2, num_gpu_blocks_override=48,
          max_num_seqs=8, max_num_batched_tokens=256)
outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
"""


def test_tensor_parallel_2_greedy_equals_one_chip(tmp_path):
    path = demo_gpt_checkpoint(str(tmp_path / "gpt"))  # 4 heads: 2 per chip
    prompts = tokenize(path, PROMPTS)
    ref = hf_greedy(path, prompts, 16)
    assert all(len(r) >= 4 for r in ref), ref
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, path, json.dumps(prompts)], capture_output=True, text=True, timeout=600, env=env
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    for g, want in zip(got, ref):
        assert prefix_match(g, want), (g, want)
