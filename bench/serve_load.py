"""Load test of vLLM on tpu: concurrent streaming clients on loopback, outputs checked.

    python bench/serve_load.py [--clients 32] [--seconds 60] [--blocks 40] [--max-tokens 24]

Starts ``python -m vllm.entrypoints.openai.api_server`` on the demo GPT (fixed seed, exported
as GPT-2; tests/python/helpers/serving.py) with a KV cache of ``--blocks`` 16-token blocks, so
that the clients together need more blocks than exist and vLLM preempts. First each prompt
runs alone (non-streamed, greedy: the reference), then ``--clients`` clients stream greedy
completions back to back for ``--seconds``. Every streamed output must equal its prompt's
reference and finish with ``length``; afterwards the server must still answer. Prints one
JSON line: requests, output tokens/s, TTFT and end-to-end latency medians and p99,
preemptions and prefix-cache hit rate from /metrics, and the ratios against the same prompts
run one at a time on the server and through ``transformers`` ``generate`` on CPU (the peer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

PROMPTS = [
    "def __init__(self",
    "import os\nimport sys\n",
    "    return",
    "class Text",
    "for i in range(",
    "#",
    "if __name__ == '__main__':\n",
    "try:\n    ",
]


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def _stream(session, base, prompt, max_tokens):
    body = {
        "model": "demo-gpt",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    ttft, text, finish = None, [], None
    async with session.post(base + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            choice = json.loads(data)["choices"][0]
            if ttft is None:
                ttft = time.perf_counter() - t0
            text.append(choice["text"])
            finish = choice.get("finish_reason") or finish
    return "".join(text), finish, ttft, time.perf_counter() - t0


async def _run(base, args, refs):
    import aiohttp

    results, mismatches = [], []
    stop = time.monotonic() + args.seconds

    async def client(i):
        k = i
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            while time.monotonic() < stop:
                p = PROMPTS[k % len(PROMPTS)]
                text, finish, ttft, e2e = await _stream(session, base, p, args.max_tokens)
                if text != refs[p] or finish != "length":
                    mismatches.append((p, text, refs[p], finish))
                results.append((ttft, e2e))
                k += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(args.clients)))
    return results, mismatches, time.perf_counter() - t0


def _transformers_tokens_per_s(path, max_tokens):
    """The peer: ``transformers`` greedy ``generate`` on CPU, the same prompts one at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    t0, n = time.perf_counter(), 0
    for p in PROMPTS:
        ids = torch.tensor([list(p.encode())])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
        n += out.shape[1] - ids.shape[1]
    return n / (time.perf_counter() - t0)


def _metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--blocks", type=int, default=40, help="KV-cache blocks (16 tokens each)")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()

    import requests

    from helpers.serving import demo_gpt_checkpoint, free_port, server_argv

    path = demo_gpt_checkpoint(tempfile.mkdtemp(prefix="serve_load_"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(path, "server.log"), "w")
    proc = subprocess.Popen(
        server_argv(
            path, port, "demo-gpt", "--num-gpu-blocks-override", str(args.blocks), "--max-num-seqs", str(args.clients)
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        t_start = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited; see {log.name}")
            try:
                if requests.get(base + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(1)
        startup = time.monotonic() - t_start
        refs, single_tokens, single_s = {}, 0, 0.0
        for p in PROMPTS:  # the reference: one request at a time
            t0 = time.perf_counter()
            r = requests.post(
                base + "/v1/completions",
                timeout=300,
                json={
                    "model": "demo-gpt",
                    "prompt": p,
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            ).json()
            single_s += time.perf_counter() - t0
            single_tokens += r["usage"]["completion_tokens"]
            refs[p] = r["choices"][0]["text"]
        results, mismatches, wall = asyncio.run(_run(base, args, refs))
        after = requests.post(
            base + "/v1/completions",
            timeout=300,
            json={
                "model": "demo-gpt",
                "prompt": PROMPTS[0],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        ).json()["choices"][0]["text"]
        metrics = requests.get(base + "/metrics", timeout=30).text
        ttfts = [t for t, _ in results if t is not None]
        e2es = [e for _, e in results]
        queries = _metric(metrics, "vllm:prefix_cache_queries_total")
        out = {
            "clients": args.clients,
            "seconds": args.seconds,
            "kv_blocks": args.blocks,
            "startup_s": round(startup, 1),
            "requests": len(results),
            "mismatches": len(mismatches),
            "still_serving": after == refs[PROMPTS[0]],
            "output_tokens_per_s": round(len(results) * args.max_tokens / wall, 1),
            "single_stream_tokens_per_s": round(single_tokens / single_s, 1),
            "ttft_median_s": round(statistics.median(ttfts), 3),
            "ttft_p99_s": round(_pct(ttfts, 0.99), 3),
            "e2e_median_s": round(statistics.median(e2es), 3),
            "e2e_p99_s": round(_pct(e2es, 0.99), 3),
            "preemptions": _metric(metrics, "vllm:num_preemptions_total"),
            "prefix_cache_hit_rate": round(_metric(metrics, "vllm:prefix_cache_hits_total") / queries, 3)
            if queries
            else 0.0,
        }
        out["ratio_vs_single_stream"] = round(out["output_tokens_per_s"] / out["single_stream_tokens_per_s"], 2)
        hf = _transformers_tokens_per_s(path, args.max_tokens)
        out["transformers_cpu_tokens_per_s"] = round(hf, 1)
        out["ratio_vs_transformers_cpu"] = round(out["output_tokens_per_s"] / hf, 2)
        if mismatches:
            out["first_mismatch"] = mismatches[0]
        print(json.dumps(out), flush=True)
        return 0 if not mismatches and out["still_serving"] else 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
