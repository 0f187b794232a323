#!/usr/bin/env bash
# Serve the model on $HOST:$PORT and, once it is healthy, ask it one question to show it
# answering. The server keeps running in the foreground; Ctrl-C (SIGINT) drains and stops it.
set -euo pipefail
: "${HOST:=127.0.0.1}" "${PORT:=30000}" "${MODEL:=smollm2-135m}" "${PY:=.venv/bin/python}"

"$PY" -m sluice.runtime serve --model "$MODEL" --host "$HOST" --port "$PORT" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server' INT TERM

until curl -sf "http://$HOST:$PORT/health" >/dev/null; do
  kill -0 "$server" 2>/dev/null || { echo "server exited during start-up" >&2; exit 1; }
  sleep 1
done

echo "--- POST /v1/chat/completions: What is the capital of France?"
curl -s "http://$HOST:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "SmolLM2-135M-Instruct",
  "messages": [{"role": "user", "content": "What is the capital of France?"}],
  "max_tokens": 32, "temperature": 0
}' | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", r["usage"])'
echo "--- serving on http://$HOST:$PORT (Ctrl-C to stop)"
wait $server
