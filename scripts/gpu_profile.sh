#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_check.sh built build-gpu/: where the device time of one layer goes,
# kernel by kernel (Nsight Compute's gpu__time_duration per launch, clocks left alone), at each probe level
#. nsys is not usable on the device machines; ncu serializes kernels, so this is each kernel's
# own time, not the overlap. One summary per run goes to $OUT/profile.log: time per kernel name, summed over
# launches, and the total; then the probe kernels' share (names with probe/sketch/set_flag, and cuBLAS GEMMs
# launched by the sketch are counted by the difference between runs).
#
#   MLA_PROFILE_ARGS='--model deepseek-v3 --mode prefill --tokens 4096'   the run (default as shown)
#   MLA_PROFILE_LEVELS='stats sketch'                                   probe levels profiled
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/profile}"
mkdir -p "$out"
log="$out/profile.log"
bin=build-gpu/mla-bisect
[[ -x "$bin" ]] || { echo "gpu_profile: $bin not built (run scripts/gpu_check.sh first)"; exit 1; }
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)"
[[ -n "$ncu_bin" ]] || { echo "gpu_profile: no ncu" | tee -a "$log"; exit 1; }
args="${MLA_PROFILE_ARGS:---model deepseek-v3 --mode prefill --tokens 4096}"
for level in ${MLA_PROFILE_LEVELS:-stats sketch}; do
  csv="/tmp/profile_$level.csv"
  probe=(--probe-level "$level" --quiet)
  echo "=== gpu_profile: $level: mla-bisect run --engine cuda:poison=0 $args ${probe[*]}" | tee -a "$log"
  # shellcheck disable=SC2086
  "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    --log-file "$csv" "$bin" run --engine cuda:poison=0 $args "${probe[@]}" --out "/tmp/profile_$level.h5" \
    >"/tmp/profile_$level.out" 2>&1 || { echo "gpu_profile: $level run failed:"; tail -n 20 "/tmp/profile_$level.out"; } | tee -a "$log"
  python3 - "$csv" <<'EOF' | tee -a "$log"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("  (no kernels)"); sys.exit()
head = rows[0]; k = head.index("Kernel Name"); v = head.index("Metric Value")
t = collections.Counter(); n = collections.Counter()
for r in rows[1:]:
    name = r[k].split("(")[0].split("<")[0].strip()[:60]
    t[name] += float(r[v].replace(",", "")) * 1e-6; n[name] += 1
tot = sum(t.values())
print(f"  total {tot:.3f} ms over {sum(n.values())} launches")
for name, ms in t.most_common(25):
    print(f"  {ms:9.3f} ms {n[name]:5d}x  {name}")
g = head.index("Grid Size") if "Grid Size" in head else None
with open(sys.argv[1] + ".launches", "w") as f:  # every launch in order: microseconds, grid, name
    for r in rows[1:]:
        f.write(f"{float(r[v].replace(',', '')) * 1e-3:10.1f} us  {r[g] if g is not None else '':>16}  {r[k][:90]}\n")
EOF
  cp "$csv.launches" "$out/launches_$(echo "$args $level" | tr -c 'a-zA-Z0-9' _ | tr -s _).txt" 2>/dev/null
done
