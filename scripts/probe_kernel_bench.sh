#!/usr/bin/env bash
# On the GPU machine: the probe kernels alone (bench/probe_kernel_bench.cu), built with nvcc and timed on the
# DeepSeek-V3 probe shapes and GLM-5's DSA scores against a device copy in the same run; optionally also built against
# other versions of the tile kernel (kernels/probe_tiles.cu) or the row kernel (kernels/probe_rows.cu), whose digest
# columns must agree with this one where they keep the same segment geometry. Log: $OUT/probe_kernel_bench.log.
#
#   MLA_PROBE_BASELINE='A.cu B.cu'   also build and time each file in place of kernels/probe_tiles.cu, as
#                                    "baseline_A", ... (another version of the tile kernel with the same host
#                                    interface, kernels/probe_kernels.cuh: e.g. an edited copy, or
#                                    `git show REV:kernels/probe_tiles.cu > A.cu`)
#   MLA_PROBE_ROWS_BASELINE='C.cu'   the same in place of kernels/probe_rows.cu, as "rows_C"
#   MLA_PROBE_SASS=1                 also write each build's SASS to $OUT/<name>.sass
#   MLA_PROBE_REPEATS=N              launches timed per shape (default 30)
#
# The default build (CMake, with CUDA) also makes build-gpu/probe_kernel_bench: `probe_kernel_bench [repeats]`
# times the kernel; `probe_kernel_bench [repeats] patterns` times read orders alone (a linear read, the
# kernel's 16-row tiles with a block's warps contiguous or interleaved, and the kernel's cp.async ring alone at
# depths 2-8 and 2-16 blocks per SM, each with the bytes it keeps in flight), the bandwidth the kernel could reach.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/probe_bench}"
mkdir -p "$out" build-gpu/probe_bench
log="$out/probe_kernel_bench.log"
: >"$log"
# The probe launch's sources besides the tile and row kernels.
sources=(kernels/probe_launch_plan.cpp kernels/probe_sketch_signs.cu)
build() {  # name, the tile kernel's source, the row kernel's source
  local name=$1 tiles=$2 rows=$3
  if ! nvcc -std=c++20 -O3 -arch=sm_90 -I. bench/probe_kernel_bench.cu "$tiles" "$rows" "${sources[@]}" \
      -o "build-gpu/probe_bench/$name" -Xptxas -v >"build-gpu/probe_bench/$name.build.log" 2>&1; then
    echo "  $name: build FAILED:"; grep -E "error|fatal" "build-gpu/probe_bench/$name.build.log" | head -n 5
    return 1
  fi
  grep -A2 "probe_tiles_kernel" "build-gpu/probe_bench/$name.build.log" | grep -E "Used|spill" | sed "s/^/  $name: /"
}
status=0
run() {
  local name=$1
  echo "=== probe_kernel_bench: $name" | tee -a "$log"
  [[ -x "build-gpu/probe_bench/$name" ]] || { echo "  not built" | tee -a "$log"; status=1; return; }
  "build-gpu/probe_bench/$name" "${MLA_PROBE_REPEATS:-30}" 2>&1 | tee -a "$log" || status=1
}
# Every build first, in parallel (each writes its own log), then the runs one at a time in the given order.
names=(current)
build current kernels/probe_tiles.cu kernels/probe_rows.cu >"build-gpu/probe_bench/current.summary" &
for base in ${MLA_PROBE_BASELINE:-}; do
  name="baseline_$(basename "$base" .cu)"
  names+=("$name")
  build "$name" "$base" kernels/probe_rows.cu >"build-gpu/probe_bench/$name.summary" &
done
for base in ${MLA_PROBE_ROWS_BASELINE:-}; do
  name="rows_$(basename "$base" .cu)"
  names+=("$name")
  build "$name" kernels/probe_tiles.cu "$base" >"build-gpu/probe_bench/$name.summary" &
done
wait
for name in "${names[@]}"; do
  tee -a "$log" <"build-gpu/probe_bench/$name.summary"
  if [[ "${MLA_PROBE_SASS:-0}" == 1 ]] && command -v cuobjdump >/dev/null; then
    cuobjdump -sass "build-gpu/probe_bench/$name" >"$out/$name.sass" 2>&1
  fi
  run "$name"
done
exit $status
