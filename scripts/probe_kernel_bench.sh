#!/usr/bin/env bash
# On the GPU machine: the probe kernel alone (bench/probe_kernel_bench.cu), built with nvcc in variants of its
# tuning macros, each timed on the DeepSeek-V3 probe shapes against a device copy in the same run; the digest
# column must agree between variants that keep the same segment geometry. Log: $OUT/probe_kernel_bench.log.
#
#   MLA_PROBE_VARIANTS='1:4 5:4 1:4:1'   min-blocks:stages[:ablate[:-DMACRO=V]] (default 1:3 1:4 1:3:1 1:3:2 1:3:4:
#                                        the shipped kernel, a deeper ring, and the shipped kernel's ablations);
#                                        ablate is MLA_PROBE_ABLATE: 1 no checksum, 2 no tensor-core sums, 4 no
#                                        sketch mma, 8 no head L2, 16 no partials or fold, 32 no sign-word copies
#                                        (wrong records: timing only; 31 leaves the ring's copies and waits); the
#                                        last field adds -D flags, comma-separated (not the macros of the first
#                                        three fields), e.g. 1:4:31:-DMLA_PROBE_PAD_SMEM=19000 (the bare loop held
#                                        at the default's 4 blocks per SM) or 1:4:0:-DMLA_PROBE_MIN_SEG_COLS=64, or
#                                        1:3:0:-DMLA_PROBE_BLOCK_FOLD=0 (version 6's last-warp fold for every shape)
#   MLA_PROBE_SASS=1                    also write each variant's SASS to $OUT/<variant>.sass
#   MLA_PROBE_BASELINE='A.cu B.cu'     also time other probe_stats.cu files (earlier versions) as "baseline_A", ...
#
# The default build (CMake, with CUDA) also makes build-gpu/probe_kernel_bench: `probe_kernel_bench [repeats]`
# times the default kernel; `probe_kernel_bench [repeats] patterns` times read orders alone (a linear read, the
# kernel's 16-row tiles with a block's warps contiguous or interleaved, and the kernel's cp.async ring alone at
# depths 2-8 and 2-16 blocks per SM, each with the bytes it keeps in flight), the bandwidth the kernel could reach.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/probe_bench}"
mkdir -p "$out" build-gpu/probe_bench
log="$out/probe_kernel_bench.log"
: >"$log"
build() {  # name, probe_stats.cu, extra flags...
  local name=$1 src=$2
  shift 2
  if ! nvcc -std=c++20 -O3 -arch=sm_90 -I. "$@" bench/probe_kernel_bench.cu "$src" \
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
names=()
for base in ${MLA_PROBE_BASELINE:-}; do
  name="baseline_$(basename "$base" .cu)"
  names+=("$name")
  build "$name" "$base" >"build-gpu/probe_bench/$name.summary" &
done
for v in ${MLA_PROBE_VARIANTS:-1:3 1:4 1:3:1 1:3:2 1:3:4}; do
  IFS=: read -r blocks stages ablate extra <<<"$v"
  ablate="${ablate:-0}"
  extra="${extra:-}"
  name="blocks${blocks}_stages${stages}$([[ "$ablate" != 0 ]] && echo "_ablate$ablate")$([[ -n "$extra" ]] && echo "_${extra//[^A-Za-z0-9]/_}")"
  names+=("$name")
  # shellcheck disable=SC2086
  build "$name" kernels/probe_stats.cu -DMLA_PROBE_TILE_MIN_BLOCKS="$blocks" -DMLA_PROBE_TILE_STAGES="$stages" \
    -DMLA_PROBE_ABLATE="$ablate" ${extra//,/ } >"build-gpu/probe_bench/$name.summary" &
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
