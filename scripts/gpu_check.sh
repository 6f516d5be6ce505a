#!/usr/bin/env bash
# On the GPU machine: configure and build with CUDA into build-gpu/, then run the GPU tests (ctest -L gpu)
# and the CPU tests (ctest -L cpu). Offline-safe: scripts/setup.sh only reports what is missing there.
#
#   MLA_SKIP_SETUP=1 ./scripts/gpu_check.sh        skip scripts/setup.sh (everything is installed)
#   MLA_GPU_TEST_REGEX='CudaStage' ./scripts/gpu_check.sh    only GPU tests whose name matches (ctest -R)
#   MLA_GPU_CHECK_CPU=0 ./scripts/gpu_check.sh     skip the CPU suite
#   MLA_GPU_CHECK_VERBOSE=1    ctest -V for the GPU suite (the log then holds each test's "[ margin ]" line:
#                              how close each equivalence test came to its calibrated tolerance)
#   MLA_GPU_CHECK_SANITIZE=1   also run the tiny GPU tests under compute-sanitizer memcheck, and the probe
#                              tests under racecheck (each bounded by MLA_SANITIZE_TIMEOUT seconds, default 300)
#   MLA_DEPS_PREFIX=DIR    a prefix holding header-only dependencies (Eigen, nlohmann_json, CLI11) and GTest,
#                          used only for a package the machine lacks (default: build-deps/ when present, a copy
#                          of this machine's Debian packages carried along for an offline GPU machine)
#
# The whole log goes to $OUT/gpu_check.log (OUT set by the device tool), else build-gpu/gpu_check.log.
# Exit status: 0 when the build and every suite that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."

log_dir="${OUT:-build-gpu}"
mkdir -p "$log_dir"
log="$log_dir/gpu_check.log"
jobs="$(nproc 2>/dev/null || echo 4)"

# deps_fallback ARRAY: appends -D<pkg>_DIR=... for each dependency the system lacks and the prefix has.
deps_fallback() {
  local -n out=$1
  local prefix="${MLA_DEPS_PREFIX:-$PWD/build-deps}"
  [[ -d "$prefix" ]] || return 0
  prefix="$(cd "$prefix" && pwd)"
  # name | config file | header (relative to an include root) | config dir inside the prefix
  local entry name cfg hdr dir
  for entry in "Eigen3|Eigen3Config.cmake|eigen3/Eigen/Core|share/eigen3/cmake" \
               "nlohmann_json|nlohmann_jsonConfig.cmake|nlohmann/json.hpp|share/cmake/nlohmann_json" \
               "CLI11|CLI11Config.cmake|CLI/CLI.hpp|share/cmake/CLI11" \
               "GTest|GTestConfig.cmake|gtest/gtest.h|lib/x86_64-linux-gnu/cmake/GTest"; do
    IFS='|' read -r name cfg hdr dir <<<"$entry"
    if [[ -n "$(find /usr /usr/local /opt -maxdepth 6 -name "$cfg" -print -quit 2>/dev/null)" ]] ||
       [[ -e "/usr/include/$hdr" || -e "/usr/local/include/$hdr" ]]; then
      echo "gpu_check: $name: installed"
    elif [[ -d "$prefix/$dir" ]]; then
      echo "gpu_check: $name: not installed; using $prefix/$dir"
      out+=("-D${name}_DIR=$prefix/$dir")
    else
      echo "gpu_check: $name: not installed, and not in $prefix"
    fi
  done
}

run_all() {
  local status=0
  echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  if [[ "${MLA_SKIP_SETUP:-0}" != 1 ]]; then
    ./scripts/setup.sh || echo "gpu_check: setup.sh failed (continuing with what is installed)"
  fi
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 || echo "gpu_check: no nvidia-smi"
  nvcc --version 2>&1 | tail -n 2

  local py_args=()
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c '' 2>/dev/null; then
    py_args=(-DMLA_PYTHON="$PWD/.venv/bin/python")
  elif command -v python3 >/dev/null 2>&1; then
    py_args=(-DMLA_PYTHON="$(command -v python3)")
  fi
  local dep_args=()
  deps_fallback dep_args
  local t0=$SECONDS
  if ! cmake -S . -B build-gpu -G Ninja -DMLA_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_CUDA_ARCHITECTURES=90 "${py_args[@]}" "${dep_args[@]}"; then
    echo "gpu_check: FAILED: configure"
    return 1
  fi
  # What the GPU suite needs first, so that a broken file elsewhere (a CPU test) cannot stop it.
  if ! cmake --build build-gpu -j"$jobs" --target mla-bisect mla_gpu_tests; then
    echo "gpu_check: FAILED: build of mla-bisect and mla_gpu_tests"
    return 1
  fi
  echo "gpu_check: build took $((SECONDS - t0)) s"

  # GPU tests: a few at a time (they share the device and each holds a model's weights in host memory).
  t0=$SECONDS
  local regex=()
  if [[ -n "${MLA_GPU_TEST_REGEX:-}" ]]; then regex=(-R "$MLA_GPU_TEST_REGEX"); fi
  local verbose=()
  if [[ "${MLA_GPU_CHECK_VERBOSE:-0}" == 1 ]]; then verbose=(-V); fi
  if ! ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 600 -j4 "${verbose[@]}" "${regex[@]}"; then
    echo "gpu_check: FAILED: gpu tests"
    status=1
  fi
  echo "gpu_check: gpu tests took $((SECONDS - t0)) s"

  if [[ "${MLA_GPU_CHECK_SANITIZE:-0}" == 1 ]]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
      t0=$SECONDS
      local tool filter
      for entry in "memcheck|Tiny/CudaLayer.*:CudaProbe.*:CudaEngine.UploadDownloadRoundsToBf16" \
                   "racecheck|CudaProbe.DeviceRecordsMatchHost:Tiny/CudaLayer.CudaIsEquivalentToRef/tiny_chunked_tp2"; do
        IFS='|' read -r tool filter <<<"$entry"
        echo "gpu_check: compute-sanitizer --tool $tool on $filter"
        if ! timeout "${MLA_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
               build-gpu/tests/mla_gpu_tests --gtest_filter="$filter" --gtest_brief=1; then
          echo "gpu_check: FAILED: compute-sanitizer $tool"
          status=1
        fi
      done
      echo "gpu_check: sanitizers took $((SECONDS - t0)) s"
    else
      echo "gpu_check: no compute-sanitizer on PATH; sanitizer runs skipped"
    fi
  fi

  if [[ "${MLA_GPU_CHECK_CPU:-1}" == 1 ]]; then
    t0=$SECONDS
    if ! cmake --build build-gpu -j"$jobs"; then
      echo "gpu_check: FAILED: build (everything else); the cpu tests that built still run"
      status=1
    fi
    if ! ctest --test-dir build-gpu -L cpu --output-on-failure --timeout 600 -j"$jobs"; then
      echo "gpu_check: FAILED: cpu tests"
      status=1
    fi
    echo "gpu_check: cpu tests took $((SECONDS - t0)) s"
  fi
  if [[ $status == 0 ]]; then echo "gpu_check: OK"; fi
  return $status
}

run_all 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
