#!/usr/bin/env bash
# vLLM's own benchmark client against the tpu server, back to back: the random dataset, then
# prefix_repetition (shared prefixes: the prefix cache). Model: the demo GPT with a fixed seed
# (tests/python/helpers/serving.py), served on tpu:0. Prints vLLM's tables; results in bench/README.md.
#   bench/serve_bench.sh [num_prompts] [max_concurrency]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-64}
C=${2:-16}
DIR=$(mktemp -d)
PY=${PYTHON:-python3}
PYTHONPATH="$PWD/tests/python${PYTHONPATH:+:$PYTHONPATH}" $PY -c \
  "from helpers.serving import demo_gpt_checkpoint as d; d('$DIR/model')"
PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
$PY -m vllm.entrypoints.openai.api_server --model "$DIR/model" --served-model-name demo-gpt --host 127.0.0.1 \
  --port "$PORT" --dtype float32 --max-num-seqs "$C" --enable-prefix-caching >"$DIR/server.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$DIR"' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $SERVER 2>/dev/null || { tail -50 "$DIR/server.log"; exit 1; }
  sleep 1
done
common=(--backend vllm --base-url "http://127.0.0.1:$PORT" --model demo-gpt --tokenizer "$DIR/model"
        --num-prompts "$N" --max-concurrency "$C" --percentile-metrics ttft,tpot,e2el --metric-percentiles 50,99)
vllm bench serve "${common[@]}" --dataset-name random --random-input-len 24 --random-output-len 24
vllm bench serve "${common[@]}" --dataset-name prefix_repetition --prefix-repetition-prefix-len 32 \
  --prefix-repetition-suffix-len 8 --prefix-repetition-num-prefixes 4 --prefix-repetition-output-len 16
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^vllm:prefix_cache_(hits|queries)_total'
