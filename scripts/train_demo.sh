#!/usr/bin/env bash
# Retrain the shipped text demo model (src/toolrollout/apps/demo/model) from scratch: the exact
# three-stage recipe that produced it (docs/quickstart.md, "Retraining").
#
#   bash scripts/train_demo.sh [OUT]     # OUT defaults to the package's own model folder
#
# Stage 1 builds the tokenizer and trains from random weights (copy warm-up, then the
# calculator, python and search dialogs); stages 2 and 3 continue on fresh dialogs (new
# seeds) at lower learning rates. Each stage is deterministic; on one idle core the whole
# chain takes about an hour (stage 1 about 30 minutes, each later stage about 15).
set -euo pipefail
OUT="${1:-src/toolrollout/apps/demo/model}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PY="${PYTHON:-python}"
TASKS=calculator,python,search

"$PY" -m toolrollout.apps.demo.train --tasks "$TASKS" --dialogs 12000 --steps 2000 \
    --batch-size 24 --copy-steps 200 --out "$WORK/stage1" --prompts-dir "$WORK/stage1"
"$PY" -m toolrollout.apps.demo.train --init-from "$WORK/stage1" --tasks "$TASKS" --seed 1 \
    --dialogs 12000 --steps 1000 --batch-size 24 --lr 3e-4 --warmup 20 --copy-steps 0 \
    --out "$WORK/stage2" --prompts-dir "$WORK/stage2"
"$PY" -m toolrollout.apps.demo.train --init-from "$WORK/stage2" --tasks "$TASKS" --seed 2 \
    --dialogs 12000 --steps 1000 --batch-size 24 --lr 2e-4 --warmup 20 --copy-steps 0 \
    --out "$OUT"
