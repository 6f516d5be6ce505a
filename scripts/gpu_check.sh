#!/usr/bin/env bash
# On the GPU machine: configure and build with CUDA into build-gpu/, then run the GPU tests (ctest -L gpu)
# and the CPU tests (ctest -L cpu). Offline-safe: scripts/setup.sh only reports what is missing there.
#
#   MLA_SKIP_SETUP=1 ./scripts/gpu_check.sh        skip scripts/setup.sh (everything is installed)
#   MLA_GPU_TEST_REGEX='CudaStage' ./scripts/gpu_check.sh    only GPU tests whose name matches (ctest -R)
#   MLA_GPU_CHECK_CPU=0 ./scripts/gpu_check.sh     skip the CPU suite
#   MLA_GPU_CHECK_ZOO=0        skip the zoo and demo runs: `mla-bisect zoo --candidate cuda` on tiny (tp 1, tp 2)
#                              and on DeepSeek-V3 dims (--tokens 16, tp 4), and ./scripts/demo.sh (a bisect of
#                              rope-neox with the CUDA candidate). They run beside the GPU suite, each logging to
#                              $OUT/zoo_*.log and $OUT/demo.log (one line per finished case, then the table),
#                              their tables and totals copied into the main log. The DeepSeek-V3 zoo is split over
#                              MLA_ZOO_SHARDS processes (default 3, zoo --shard), one log each.
#   MLA_ZOO_RUNS='dsv3_tp4'    which of tiny_tp1 tiny_tp2 dsv3_tp4 demo run (default: all four)
#   MLA_GPU_CHECK_VERBOSE=1    ctest -V for the GPU suite (the log then holds each test's "[ margin ]" line:
#                              how close each equivalence test came to its calibrated tolerance)
#   MLA_GPU_CHECK_SANITIZE=1   also run the tiny GPU tests under compute-sanitizer memcheck, and the probe
#                              tests under racecheck (each bounded by MLA_SANITIZE_TIMEOUT seconds, default 300);
#                              then each tool on its canary (a planted out-of-bounds write, a shared-memory race),
#                              which it must report
#   MLA_DEPS_PREFIX=DIR    a prefix holding header-only dependencies (Eigen, nlohmann_json, CLI11) and GTest,
#                          used only for a package the machine lacks (default: build-deps/ when present, a copy
#                          of this machine's Debian packages carried along for an offline GPU machine)
#
# The whole log goes to $OUT/gpu_check.log (OUT: a folder for results, when the caller sets one), else
# build-gpu/gpu_check.log.
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
  venv="$(./scripts/venv_path.sh)"
  # The project venv when it has the modules; an offline GPU machine whose python3 is itself a venv (torch installed
  # there) leaves ours without them, and then that python3 is the one to use.
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import numpy, h5py' 2>/dev/null; then
    py_args=(-DMLA_PYTHON="$venv/bin/python")
  elif command -v python3 >/dev/null 2>&1; then
    py_args=(-DMLA_PYTHON="$(command -v python3)")
  fi
  local dep_args=()
  deps_fallback dep_args
  local t0=$SECONDS
  if ! cmake -S . -B build-gpu -G Ninja -DMLA_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_CUDA_ARCHITECTURES=90a "${py_args[@]}" "${dep_args[@]}"; then
    echo "gpu_check: FAILED: configure"
    return 1
  fi
  # What the GPU suite needs first, so that a broken file elsewhere (a CPU test) cannot stop it.
  if ! cmake --build build-gpu -j"$jobs" --target mla-bisect mla_gpu_tests; then
    echo "gpu_check: FAILED: build of mla-bisect and mla_gpu_tests"
    return 1
  fi
  echo "gpu_check: build took $((SECONDS - t0)) s"

  # The zoo with the CUDA candidate and the demo: started now, they run beside the GPU suite.
  local zoo_names=() zoo_pids=()
  if [[ "${MLA_GPU_CHECK_ZOO:-1}" == 1 ]]; then
    local zt0=$SECONDS
    local bin="$PWD/build-gpu/mla-bisect"
    local runs=" ${MLA_ZOO_RUNS:-tiny_tp1 tiny_tp2 dsv3_tp4 demo} "
    rm -f "$log_dir"/zoo_*.log "$log_dir/demo.log"  # a previous run's logs would join the totals
    start_bg() {  # NAME LOG CMD...: runs CMD in the background, output to LOG
      local name=$1 out=$2
      shift 2
      ("$@" >"$out" 2>&1) &
      zoo_names+=("$name")
      zoo_pids+=($!)
    }
    local shards="${MLA_ZOO_SHARDS:-3}" k
    if [[ $runs == *" dsv3_tp4 "* ]]; then
      for ((k = 0; k < shards; ++k)); do
        start_bg "zoo_dsv3_tp4 shard $k/$shards" "$log_dir/zoo_dsv3_tp4_$k.log" \
          "$bin" zoo --candidate cuda --model deepseek-v3 --tokens 16 --tp 4 --clean-seeds 2 --shard "$k/$shards" \
          --progress --workdir build-gpu/zoo-cuda-dsv3-tp4
      done
    fi
    if [[ $runs == *" tiny_tp1 "* ]]; then
      start_bg zoo_tiny_tp1 "$log_dir/zoo_tiny_tp1.log" \
        "$bin" zoo --candidate cuda --model tiny --tp 1 --progress --workdir build-gpu/zoo-cuda-tiny-tp1
    fi
    if [[ $runs == *" tiny_tp2 "* ]]; then
      start_bg zoo_tiny_tp2 "$log_dir/zoo_tiny_tp2.log" \
        "$bin" zoo --candidate cuda --model tiny --tp 2 --progress --workdir build-gpu/zoo-cuda-tiny-tp2
    fi
    if [[ $runs == *" demo "* ]]; then
      start_bg demo "$log_dir/demo.log" env MLA_DEMO_BIN="$bin" ./scripts/demo.sh
    fi
  fi

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
  # The probe kernels are launched as programmatic dependents unless the engine has probe_pdl=0: the probe tests
  # again with plain launches (the GPU tests' engine helper appends MLA_TEST_CUDA_OPTIONS, a test-only variable, to
  # its engines' options), so that both ways stay right.
  if [[ -z "${MLA_GPU_TEST_REGEX:-}" || "${MLA_GPU_TEST_REGEX}" == *CudaProbe* ]]; then
    if ! MLA_TEST_CUDA_OPTIONS=probe_pdl=0 ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 600 -j4 \
        -R 'CudaProbe|Determinism'; then
      echo "gpu_check: FAILED: probe tests with plain launches (cuda:probe_pdl=0)"
      status=1
    fi
  fi

  if [[ ${#zoo_pids[@]} -gt 0 ]]; then
    local i rc
    for i in "${!zoo_pids[@]}"; do
      rc=0
      wait "${zoo_pids[$i]}" || rc=$?
      echo "gpu_check: ${zoo_names[$i]}: exit $rc"
      if [[ $rc != 0 ]]; then
        echo "gpu_check: FAILED: ${zoo_names[$i]}"
        status=1
      fi
    done
    # Each zoo's table rows (the DeepSeek-V3 shards together) and one total.
    local zoo logs f
    for zoo in zoo_tiny_tp1 zoo_tiny_tp2 zoo_dsv3_tp4; do
      logs=()
      for f in "$log_dir/$zoo.log" "$log_dir/$zoo"_[0-9]*.log; do [[ -f $f ]] && logs+=("$f"); done
      [[ ${#logs[@]} -gt 0 ]] || continue
      echo "gpu_check: $zoo (logs: ${logs[*]})"
      for f in "${logs[@]}"; do
        if grep -q " as expected; " "$f"; then
          sed -n '/^injection /,/ as expected; /p' "$f" | grep -vE "^injection |^$| as expected; " | sed 's/^/  /'
        else  # killed or failed before its table: what it finished, and its last lines
          echo "  $f has no table; finished cases and last lines:"
          grep "^zoo \[" "$f" | sed 's/^/    /'
          tail -n 3 "$f" | grep -v "^zoo \[" | sed 's/^/    /'
        fi
      done
      cat "${logs[@]}" | awk '/ as expected; / { ok += $1; n += $3; miss += $6; fa += $(NF-5); tables++ }
        END { printf "  total (%d table%s): %d of %d as expected; %d injected bugs missed or mislocated, %d clean or benign runs flagged\n", tables, tables == 1 ? "" : "s", ok, n, miss, fa }'
    done
    if [[ -f "$log_dir/demo.log" ]]; then
      echo "gpu_check: demo (log: $log_dir/demo.log)"
      grep -E "^== mla-bisect|^where |^diagnosis|^isolation|^demo:" "$log_dir/demo.log" | sed 's/^/  /'
    fi
    echo "gpu_check: zoo and demo took $((SECONDS - zt0)) s (beside the gpu tests)"
  fi

  if [[ "${MLA_GPU_CHECK_SANITIZE:-0}" == 1 ]]; then
    if command -v compute-sanitizer >/dev/null 2>&1; then
      t0=$SECONDS
      local tool filter
      for entry in "memcheck|Tiny/CudaLayer.*:CudaProbe.*:CudaEngine.UploadDownloadRoundsToBf16:-CudaProbe.WideTensorsMatchHost" \
                   "racecheck|CudaProbe.DeviceRecordsMatchHost:CudaProbe.ManyTilesFoldInTheirBlock:Tiny/CudaLayer.CudaIsEquivalentToRef/tiny_chunked_tp2"; do
        IFS='|' read -r tool filter <<<"$entry"
        echo "gpu_check: compute-sanitizer --tool $tool on $filter"
        # --report-api-errors no: on several GPUs NCCL probes with calls that are meant to fail (peer access
        # already enabled, kernel images for other architectures), which memcheck would count as errors; our own
        # API calls are all checked (CUDA_CHECK), and memory errors and races are still reported.
        if ! timeout "${MLA_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 --report-api-errors no \
               build-gpu/tests/mla_gpu_tests --gtest_filter="$filter" --gtest_brief=1; then
          echo "gpu_check: FAILED: compute-sanitizer $tool"
          status=1
        fi
      done
      # The canaries (tests/gpu/test_cuda_sanitizer_canary.cu): a planted out-of-bounds write and a shared-memory
      # race. Each check must fail on its canary, or its clean reports above prove nothing.
      for entry in "memcheck|CudaSanitizerCanary.OutOfBoundsWrite" "racecheck|CudaSanitizerCanary.SharedMemoryRace"; do
        IFS='|' read -r tool filter <<<"$entry"
        local rc=0
        MLA_SANITIZER_CANARY=1 timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 --report-api-errors no \
          build-gpu/tests/mla_gpu_tests --gtest_filter="$filter" --gtest_brief=1 >"build-gpu/canary_$tool.log" 2>&1 || rc=$?
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid __global__ write|Race reported" "build-gpu/canary_$tool.log" | head -n 3
        if [[ $rc == 9 ]]; then
          echo "gpu_check: compute-sanitizer $tool caught its canary ($filter): exit 9, as it should"
        else
          echo "gpu_check: FAILED: compute-sanitizer $tool did not catch its canary ($filter): exit $rc"
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
