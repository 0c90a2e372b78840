#!/usr/bin/env bash
# The container image, built and started: deploy/container/build-image.sh builds it
# (mmdebstrap base + buildah), then the image's entrypoint runs in a buildah working
# container (chroot isolation: this machine, itself a container, cannot give crun its
# cgroups) with stories260K mounted read-only; the image's own HEALTHCHECK command must
# report SERVING, a streamed OpenAI chat request and a gRPC one must be answered, the
# server must run as the unprivileged user, and SIGTERM must stop it cleanly.
# Usage: tests/deploy/container_test.sh   (root; PS_TEST_BUILDS=container scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=localhost/pruneserve:test
MODEL_DIR=$(cd ../shared/testdata/stories260K && pwd)
deploy/container/build-image.sh "$TAG"

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
GRPC=$(free_port); HTTP=$(free_port); METRICS=$(free_port)
ctr=$(buildah from --quiet "$TAG")
log=$(mktemp)
cleanup() { pkill -TERM -f "pruneserve --model /models/stories260K.gguf" 2>/dev/null || true; buildah rm "$ctr" >/dev/null; rm -f "$log"; }
trap cleanup EXIT
entrypoint=$(podman image inspect --format '{{index .Config.Entrypoint 0}}' "$TAG")
buildah run --isolation chroot --network host -v "$MODEL_DIR:/models:ro" -e PS_MODEL=/models/stories260K.gguf "$ctr" \
  -- "$entrypoint" --port "$GRPC" --http-port "$HTTP" --metrics-port "$METRICS" >"$log" 2>&1 &
runner=$!

# The image's HEALTHCHECK command (docker format), pointed at this run's gRPC port.
health=$(podman image inspect --format '{{index .Config.Healthcheck.Test 1}}' "$TAG" | sed "s/50051/$GRPC/")
[ -n "$health" ] || { echo "container_test: the image has no HEALTHCHECK" >&2; exit 1; }
for _ in $(seq 600); do
  buildah run --isolation chroot --network host "$ctr" -- sh -c "$health" 2>/dev/null && break
  kill -0 $runner 2>/dev/null || { cat "$log"; echo "container_test: the server exited" >&2; exit 1; }
  sleep 0.1
done
buildah run --isolation chroot --network host "$ctr" -- sh -c "$health" || { cat "$log"; exit 1; }
echo "container_test: HEALTHCHECK reports SERVING"

pid=$(pgrep -f "pruneserve --model /models/stories260K.gguf")
[ "$(stat -c %u /proc/"$pid")" = 10001 ] || { echo "container_test: the server does not run as uid 10001" >&2; exit 1; }
answer=$(curl -sS -N "http://127.0.0.1:$HTTP/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}' \
  -o /dev/null -w '%{http_code}')
# stories260K has no chat template: the API must say so (400), not fail.
[ "$answer" = 400 ] || { echo "container_test: chat answered $answer" >&2; exit 1; }
text=$(curl -sS -N "http://127.0.0.1:$HTTP/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stream": true}')
grep -q 'data: \[DONE\]' <<<"$text" || { echo "container_test: no streamed completion: $text" >&2; exit 1; }
got=$(python3 -c 'import json, sys
print("".join(json.loads(l[6:])["choices"][0]["text"] for l in sys.stdin if l.startswith("data: {")))' <<<"$text")
want=$(build/pruneserve-run --model "$MODEL_DIR/stories260K.gguf" --prompt "Once upon a time" --max-new-tokens 12 \
  --ignore-eos --threads 1 2>/dev/null)
[ "$got" = "$want" ] || { echo "container_test: streamed '$got', offline '$want'" >&2; exit 1; }
build/pruneserve-cli --addr "127.0.0.1:$GRPC" generate --prompt "Once upon a time" --max-new-tokens 8 \
  --temperature 0 >/dev/null
echo "container_test: streamed over HTTP and gRPC as uid 10001"

kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait $runner || { cat "$log"; echo "container_test: the server did not exit cleanly" >&2; exit 1; }
grep -q "stopped" "$log" || { cat "$log"; exit 1; }
echo "container_test: SIGTERM drained and stopped the server: passed"
