"""vLLM's OpenAI-compatible server on the tpu platform (one server for the whole file).

``python -m vllm.entrypoints.openai.api_server --model DIR`` serves the exported demo GPT
(fixed seed, helpers/serving.py) on tpu. Oracle: ``transformers`` greedy on CPU in float32
(cut at near-ties) for completions and chat; the non-streamed reply for the streamed one.
Bad input gets its HTTP error and the server keeps serving the next request correctly.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import time

import pytest

pytest.importorskip("vllm")
requests = pytest.importorskip("requests")

from helpers.serving import demo_gpt_checkpoint, free_port, hf_greedy, prefix_match, server_argv  # noqa: E402

MODEL = "demo-gpt"
N_NEW = 16
PROMPT = "def __init__(self"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = demo_gpt_checkpoint(str(tmp_path_factory.mktemp("demo_gpt_http")))
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w+")
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's own engine process, as deployed
    proc = subprocess.Popen(
        server_argv(
            path,
            port,
            MODEL,
            "--num-gpu-blocks-override",
            "64",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "256",
            "--seed",
            "0",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read()[-4000:]}")
        try:
            if requests.get(base + "/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("vLLM server did not start in 600 s")
        time.sleep(1)
    yield base, path, port
    proc.send_signal(signal.SIGINT)  # vLLM's clean shutdown (it stops its engine process too)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def oracle(server):
    _, path, _ = server
    chat_prompt = list(b"user: hi\nassistant: ")
    ref = hf_greedy(path, [list(PROMPT.encode()), list(b"import os\n"), chat_prompt], N_NEW)
    return {"completion": ref[0], "second": ref[1], "chat": ref[2]}


def _complete(base, prompt, **kw):
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": N_NEW,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
        **kw,
    }
    r = requests.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _still_serving(base, oracle):
    got = _complete(base, PROMPT)["choices"][0]["token_ids"]
    assert prefix_match(got, oracle["completion"]), (got, oracle["completion"])


def test_models_lists_the_model(server):
    base, _, _ = server
    r = requests.get(base + "/v1/models", timeout=30).json()
    assert [m["id"] for m in r["data"]] == [MODEL]
    assert r["data"][0]["max_model_len"] == 64  # the demo's --seq-len


def test_completion_greedy_equals_transformers(server, oracle):
    base, _, _ = server
    out = _complete(base, PROMPT)
    assert prefix_match(out["choices"][0]["token_ids"], oracle["completion"])
    usage = out["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(PROMPT), N_NEW)  # one token per byte
    batched = _complete(base, [PROMPT, "import os\n"])  # two prompts in one request
    ids = {c["index"]: c["token_ids"] for c in batched["choices"]}
    assert prefix_match(ids[0], oracle["completion"]) and prefix_match(ids[1], oracle["second"])


def test_chat_completion_uses_the_template(server, oracle):
    base, _, _ = server
    r = requests.post(
        base + "/v1/chat/completions",
        timeout=120,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": N_NEW,
            "temperature": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["prompt_tokens"] == len(b"user: hi\nassistant: ")
    assert prefix_match(choice["token_ids"], oracle["chat"])


def test_streaming_sse_equals_non_streamed(server, oracle):
    base, _, _ = server
    whole = _complete(base, PROMPT)["choices"][0]["text"]
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": N_NEW, "temperature": 0, "stream": True, "ignore_eos": True}
    chunks, done = [], False
    with requests.post(base + "/v1/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith(b"data: ")
            data = line[len(b"data: ") :]
            if data == b"[DONE]":
                done = True
                break
            chunks.append(json.loads(data)["choices"][0]["text"])
    assert done and len(chunks) >= 2
    assert "".join(chunks) == whole


def test_metrics(server, oracle):
    base, _, _ = server
    _complete(base, PROMPT)
    _complete(base, PROMPT)  # the second one finds its first full block in the prefix cache
    text = requests.get(base + "/metrics", timeout=30).text
    metrics = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and f'model_name="{MODEL}"' in line:
            name, value = line.rsplit(" ", 1)
            metrics[name.split("{")[0]] = float(value)
    assert metrics["vllm:num_requests_running"] == 0
    assert metrics["vllm:prefix_cache_queries_total"] > 0
    assert metrics["vllm:prefix_cache_hits_total"] >= 16


@pytest.mark.parametrize(
    "body,status,needle",
    [
        ({"prompt": "x" * 80, "max_tokens": 4}, 400, "maximum context length is 64"),
        ({"prompt": "abc", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "abc", "max_tokens": -3}, 400, "max_tokens"),
        ({"prompt": "abc", "max_tokens": 4, "model": "no-such-model"}, 404, "no-such-model"),
    ],
)
def test_bad_requests_get_http_errors(server, oracle, body, status, needle):
    base, _, _ = server
    r = requests.post(base + "/v1/completions", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]
    _still_serving(base, oracle)


def test_malformed_json(server, oracle):
    base, _, _ = server
    r = requests.post(
        base + "/v1/completions",
        data=b'{"model": "demo-gpt", "prompt": ',
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400
    assert "JSON" in r.text
    _still_serving(base, oracle)


def test_client_disconnect_mid_stream(server, oracle):
    base, _, port = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps(
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True, "ignore_eos": True}
    )
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.readline().startswith(b"data: ")  # the first event arrived, then the client goes away
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    _still_serving(base, oracle)
    deadline = time.monotonic() + 60
    while True:  # the abandoned request is aborted: nothing left running
        text = requests.get(base + "/metrics", timeout=30).text
        running = [ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{")]
        if running and float(running[0].rsplit(" ", 1)[1]) == 0:
            break
        assert time.monotonic() < deadline, running
        time.sleep(0.5)
