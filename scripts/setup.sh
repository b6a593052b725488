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
test -f "$deps/py/cutlass_library/source/include/cute/tensor.hpp" || {
  echo "setup: CuTe headers missing under $deps/py/cutlass_library/source/include" >&2; exit 1; }
echo "setup: dependencies ready (.deps)"
