#!/usr/bin/env bash
# Builds (scripts/build.sh) and runs the main job. Extra args are appended to the command.
set -euo pipefail
cd "$(dirname "$0")/.."

# ==== the main job: change it here =================================================================
# A bisect of a planted bug (rope-neox: rotate-half applied to interleaved rope lanes) on DeepSeek-V3 dims,
# 64 tokens. The candidate is the CUDA engine when a GPU is present, else a bf16-emulating reference.
# Exit 1 (a divergence found) is the expected outcome of the demo, so it is reported, not treated as failure.
# MLA_DEMO_BIN=PATH runs that mla-bisect and skips the build (scripts/gpu_check.sh passes its build-gpu one).
DEMO_CMD=("${MLA_DEMO_BIN:-build/mla-bisect}" bisect --model deepseek-v3 --tokens 64 --inject rope-neox
          --workdir build/demo)
# ===================================================================================================

if [[ -z "${MLA_DEMO_BIN:-}" ]]; then ./scripts/build.sh; fi
rc=0
"${DEMO_CMD[@]}" "$@" || rc=$?
if [[ $rc -eq 1 ]]; then
  echo "demo: the planted bug was found (exit 1 = divergence), as it should be"
  exit 0
fi
exit $rc
