#!/usr/bin/env bash
# Builds (scripts/build.sh) and runs the main job. Extra args are appended to the command.
set -euo pipefail
cd "$(dirname "$0")/.."

# ==== the main job: change it here =================================================================
# Later: a bisect of a planted bug on the built-in model. For now: the reference's per-probe table.
DEMO_CMD=(build/mla-bisect run --engine reference --model deepseek-v3 --tokens 64)
# ===================================================================================================

./scripts/build.sh
exec "${DEMO_CMD[@]}" "$@"
