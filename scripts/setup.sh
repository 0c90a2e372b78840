#!/usr/bin/env bash
# Installs what the build and the tests need: Debian packages (apt-get runs only
# when something is missing) and a Python virtual environment in .cache/venv for the
# PyPI clients the tests use (the official `openai` client, kubernetes-validate,
# transformers as the reference renderer of chat templates),
# which sees Debian's python3-grpcio and friends too. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-pip python3-venv clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libdnnl-dev libcpp-httplib-dev
  python3-grpcio python3-prometheus-client python3-yaml python3-matplotlib
  prometheus curl
)
# kustomize for the manifests' tests: any kubectl has it; Debian's is kubernetes-client.
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # The tests start their own Prometheus; the package's service would hold port 9090.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
VENV=.cache/venv
# transformers (no torch): the reference renderer of chat templates (tests/jinja/); jsonschema: the
# judge of structured outputs (tests/server/openai_client_test.py).
PIP_PACKAGES=("openai==3.54.0" "kubernetes-validate==1.37.0" "transformers==5.24.0" "jinja2==3.1.6" "jsonschema==4.26.0")
if ! "$VENV/bin/python" -c "import openai, kubernetes_validate, transformers, jinja2, jsonschema" 2>/dev/null; then
  echo "setup: creating $VENV (${PIP_PACKAGES[*]})"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PIP_PACKAGES[@]}"
fi
