#!/usr/bin/env bash
# Builds what the main job runs (the mla-bisect binary only, and only the packages that needs), then runs it.
# Extra args are appended to the command.
set -euo pipefail
cd "$(dirname "$0")/.."

# Where mla-bisect is built. build/, the folder scripts/build.sh and scripts/test.sh share, except on a machine
# without a GPU whose build/ would compile the CUDA engine (a CUDA compiler is installed) and has no binary yet: there
# the demo builds a CPU-only mla-bisect in build-cpu/ instead, because it runs the reference only and the CUDA
# sources are a fifth of mla-bisect's compile time (docs/performance.md, "Build").
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }
nvcc_found() {  # where CMake's check_language(CUDA) looks
  [[ -n "${CUDACXX:-}" ]] || command -v nvcc >/dev/null 2>&1 || [[ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]] ||
    [[ -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]] || [[ -x /usr/local/cuda/bin/nvcc ]]
}
build_has_cuda() {  # would build/ compile the CUDA engine?
  if [[ -f build/CMakeCache.txt ]]; then
    grep -q '^MLA_WITH_CUDA:BOOL=ON' build/CMakeCache.txt
  else
    nvcc_found
  fi
}
demo_build_dir() {
  if has_gpu; then echo build
  elif [[ -f build-cpu/CMakeCache.txt ]]; then echo build-cpu
  elif build_has_cuda && [[ ! -x build/mla-bisect ]]; then echo build-cpu
  else echo build
  fi
}
if [[ -z "${MLA_DEMO_BIN:-}" ]]; then
  bdir="$(demo_build_dir)"
  demo_bin="$bdir/mla-bisect"
else
  demo_bin="$MLA_DEMO_BIN"
fi

# ==== the main job: change it here =================================================================
# A bisect of a planted bug (rope-neox: rotate-half applied to interleaved rope lanes) on DeepSeek-V3 dims,
# 64 tokens. The candidate is the CUDA engine when a GPU is present, else a bf16-emulating reference.
# Exit 1 (a divergence found) is the expected outcome of the demo, so it is reported, not treated as failure.
# MLA_DEMO_BIN=PATH runs that mla-bisect and skips the build (scripts/gpu_check.sh passes its build-gpu one).
DEMO_CMD=("$demo_bin" bisect --model deepseek-v3 --tokens 64 --inject rope-neox --workdir build/demo)
# ===================================================================================================

if [[ -z "${MLA_DEMO_BIN:-}" ]]; then
  cfg=()
  if [[ "$bdir" == build-cpu ]]; then
    echo "demo: no GPU here; building a CPU-only mla-bisect in build-cpu/ (build/ would compile the CUDA engine)"
    cfg=(-DMLA_WITH_CUDA=OFF -DMLA_BUILD_TESTS=OFF)
  fi
  # No Python, no fuzzer toolchain, no test binaries: the demo runs mla-bisect only. The build's output goes to its
  # logs, a line per fifth of it on the terminal.
  MLA_SETUP_FOR=build MLA_BUILD_QUIET=1 MLA_BUILD_DIR="$bdir" MLA_BUILD_TARGETS=mla-bisect ./scripts/build.sh \
    "${cfg[@]}"
fi
rc=0
"${DEMO_CMD[@]}" "$@" || rc=$?
if [[ $rc -eq 1 ]]; then
  echo "demo: the planted bug was found (exit 1 = divergence), as it should be"
  exit 0
fi
exit $rc
