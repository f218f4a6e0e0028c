#!/usr/bin/env bash
# The real SGLang server the engine tests start (tests/real_engines/sglang), in its own
# virtualenv as users run it beside their trainer: .engines/sglang (SGLANG_VENV to put it
# elsewhere), from package registries only. Idempotent (stamps below); about 3 minutes and
# 7 GB from scratch. What and why: docs/engines.md, "Real SGLang on a CPU".
#   1. libnuma (Debian's libnuma-dev): SGLang's CPU path loads libnuma.so.
#   2. requirements/sglang-cpu/requirements.txt: sglang's dependencies minus the CUDA-only ones.
#   3. sglang==0.5.23 with --no-deps (its metadata pins CUDA-only packages).
#   4. requirements/sglang-cpu: toolrollout's sgl_kernel stand-in, the two kernel functions
#      the CPU path imports, in torch (no CPU build of sgl-kernel is on PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SGLANG_VENV:-.engines/sglang}
PYTHON=${PYTHON:-python3}
SGLANG_VERSION=0.5.23

if [ ! -e /usr/lib/x86_64-linux-gnu/libnuma.so ] && ! ldconfig -p 2>/dev/null | grep -q 'libnuma\.so '; then
    sudo_=""; [ "$(id -u)" = "0" ] || sudo_="sudo"
    $sudo_ apt-get update -qq && $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma-dev
fi

# A stamp per layer: the venv is rebuilt when the requirements or sglang's version change,
# and only the stand-in is reinstalled when it alone changed.
stamp() { cat "$@" | sha256sum | cut -c1-16; }
deps_stamp=$(echo "$SGLANG_VERSION" | stamp - requirements/sglang-cpu/requirements.txt)
standin_stamp=$(stamp requirements/sglang-cpu/pyproject.toml requirements/sglang-cpu/sgl_kernel/*.py)

if [ "$(cat "$VENV/.deps-stamp" 2>/dev/null)" != "$deps_stamp" ]; then
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet -r requirements/sglang-cpu/requirements.txt
    "$VENV/bin/pip" install --quiet --no-deps "sglang==$SGLANG_VERSION"
    echo "$deps_stamp" > "$VENV/.deps-stamp"
fi
if [ "$(cat "$VENV/.standin-stamp" 2>/dev/null)" != "$standin_stamp" ]; then
    "$VENV/bin/pip" install --quiet --no-deps --force-reinstall ./requirements/sglang-cpu
    echo "$standin_stamp" > "$VENV/.standin-stamp"
fi
# Cheap on purpose (importing sglang and torch takes most of a minute here): the tests start
# the server, and a broken install fails there with the server's log.
"$VENV/bin/python" -c "import importlib.metadata as m; m.version('sglang'); m.version('toolrollout-sgl-kernel-cpu')" \
    || { echo "error: $VENV lacks sglang or the sgl_kernel stand-in" >&2; exit 1; }
