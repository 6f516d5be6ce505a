#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu_check.sh built build-gpu/: `mla-bisect bench --engine cuda` on the
# benchmark shapes (DeepSeek-V3 prefill T = 512 and 4096, decode B = 64/128 at L = 4096, the attention core
# with 16 heads per rank, the GLM-5 layer: prefill, chunked over 16384 cached tokens, decode; glm5 shapes with v1:
# DSA's gather kernel) plus the version-1 attention kernels, attention_mha versions 2 and 3
# (v2prefill*, v3prefill*: mha_kernel=2 and 3, the flash kernels on mma.sync; the default is version 4 on wgmma and
# TMA), attention_mqa version 2 (mqa2decode*: mqa_kernel=2, mma.sync; the default is version 3 on wgmma and TMA) and
# q_b_proj / kv_b_proj as one GEMM and a per-head copy (copyprefill4096: head_split=copy) for comparison. Each run
# measures its own ceilings (cuBLAS GEMM 8192^3, device copy). Every run's table goes to $OUT/bench.log and the
# JSON files into $OUT/bench_json.tar.gz (one archive rather than a file per run); without OUT, build-gpu/bench/.
#
#   MLA_BENCH_ONLY='prefill4096 decode16h'   run only these shape names (see the list below)
#   MLA_BENCH_EXTRA='--repeats 30'           extra arguments for every run
#   MLA_BENCH_CUDA='probe_launch=stage'      extra cuda engine options for every run (docs/gpu.md lists them)
#   MLA_BENCH_ANCHOR=0                       leave out the PyTorch anchors (bench/torch_anchor.py)
set -uo pipefail
cd "$(dirname "$0")/.."

out="${OUT:-build-gpu/bench}"
work=build-gpu/bench
mkdir -p "$out" "$work"
log="$out/bench.log"
: >"$log"
bin=build-gpu/mla-bisect
[[ -x "$bin" ]] || { echo "gpu_bench: $bin not built (run scripts/gpu_check.sh first)"; exit 1; }

# DeepSeek-V3 with 16 heads: one rank's attention at tp 8, run at tp 1 so that nothing else shares the GPU.
cfg16="$work/dsv3-16heads"
mkdir -p "$cfg16"
sed -e 's/"num_attention_heads": 128/"num_attention_heads": 16/' \
    -e 's/"num_key_value_heads": 128/"num_key_value_heads": 16/' tests/testdata/deepseek_v3_config.json \
    >"$cfg16/config.json"

# Poisoning outputs with NaN is a debugging aid: its memsets are not part of the layer.
E="cuda:poison=0${MLA_BENCH_CUDA:+,$MLA_BENCH_CUDA}"
shapes=(
  "prefill512|--engine $E --model deepseek-v3 --mode prefill --tokens 512 --probe-level sketch --probe-repeats 10"
  "prefill4096|--engine $E --model deepseek-v3 --mode prefill --tokens 4096 --probe-level sketch --probe-repeats 10"
  "v2prefill4096|--engine $E,mha_kernel=2 --model deepseek-v3 --mode prefill --tokens 4096 --probe-level stats --probe-repeats 1"
  "v3prefill4096|--engine $E,mha_kernel=3 --model deepseek-v3 --mode prefill --tokens 4096 --probe-level stats --probe-repeats 1"
  "copyprefill4096|--engine $E,head_split=copy --model deepseek-v3 --mode prefill --tokens 4096 --probe-level stats --probe-repeats 1"
  "v3prefill512|--engine $E,mha_kernel=3 --model deepseek-v3 --mode prefill --tokens 512 --probe-level stats --probe-repeats 1"
  "decode64|--engine $E --model deepseek-v3 --mode decode --batch 64 --context 4096 --probe-level sketch --probe-repeats 10"
  "decode128|--engine $E --model deepseek-v3 --mode decode --batch 128 --context 8192 --probe-level sketch --probe-repeats 10"
  "mqa2decode64|--engine $E,mqa_kernel=2 --model deepseek-v3 --mode decode --batch 64 --context 4096 --probe-level stats --probe-repeats 1"
  "mqa2decode128|--engine $E,mqa_kernel=2 --model deepseek-v3 --mode decode --batch 128 --context 8192 --probe-level stats --probe-repeats 1"
  "mqa2decode16h|--engine $E,mqa_kernel=2 --model $cfg16/config.json --mode decode --batch 64 --context 4096 --probe-level stats --probe-repeats 1"
  "decode16h|--engine $E --model $cfg16/config.json --mode decode --batch 64 --context 4096 --probe-level sketch --probe-repeats 5"
  "glm5prefill4096|--engine $E --model glm-5 --mode prefill --tokens 4096 --probe-level sketch --probe-repeats 5"
  "glm5chunked512ctx16k|--engine $E --model glm-5 --mode chunked --tokens 512 --context 16384 --probe-level stats --probe-repeats 1"
  "v1glm5prefill4096|--engine $E,mha_kernel=1 --model glm-5 --mode prefill --tokens 4096 --probe-level stats --probe-repeats 0 --repeats 3"
  "glm5decode64|--engine $E --model glm-5 --mode decode --batch 64 --context 4096 --probe-level sketch --probe-repeats 5"
  "glm5decode64ctx16k|--engine $E --model glm-5 --mode decode --batch 64 --context 16384 --probe-level sketch --probe-repeats 5"
  "v2prefill512|--engine $E,mha_kernel=2 --model deepseek-v3 --mode prefill --tokens 512 --probe-level stats --probe-repeats 1"
  "v1prefill512|--engine $E,mha_kernel=1 --model deepseek-v3 --mode prefill --tokens 512 --probe-level stats --probe-repeats 1"
  "v1decode16h|--engine $E,mqa_kernel=1 --model $cfg16/config.json --mode decode --batch 64 --context 4096 --probe-level stats --probe-repeats 1"
)

status=0
ran=()
for entry in "${shapes[@]}"; do
  name="${entry%%|*}"
  args="${entry#*|}"
  if [[ -n "${MLA_BENCH_ONLY:-}" && " ${MLA_BENCH_ONLY} " != *" $name "* ]]; then continue; fi
  ran+=("$name")
  rm -f "$work/bench_$name.json"
  {
    echo "=== gpu_bench: $name: mla-bisect bench $args ${MLA_BENCH_EXTRA:-}"
    t0=$SECONDS
    # shellcheck disable=SC2086
    if ! "$bin" bench $args ${MLA_BENCH_EXTRA:-} --json "$work/bench_$name.json" 2>&1; then
      echo "gpu_bench: $name FAILED"
      status=1
    fi
    echo "gpu_bench: $name took $((SECONDS - t0)) s"
  } 2>&1 | tee -a "$log"
done
# One table of the probe overhead, every shape that measured it: per layer of a run of layers back to back (the
# layer's records built while the next one runs) and of one layer alone, synchronized: the wall without probes and
# the overhead at each level (median of the probe rounds).
if command -v python3 >/dev/null 2>&1; then
  python3 - "$work" "${ran[@]}" <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
work, rows, layers = sys.argv[1], [], set()
for shape in sys.argv[2:]:
    path = os.path.join(work, f"bench_{shape}.json")
    if not os.path.exists(path): continue
    j = json.load(open(path))
    over = j.get("probe_overhead", [])
    if not over: continue
    layers.add(j.get("run_layers", 0))
    run = j["layer"].get("run_wall", {}).get("median_s", 0) * 1e3
    wall = j["layer"].get("wall", j["layer"]["time"])["median_s"] * 1e3
    def cell(level, key):
        r = [p.get(key, 0) for p in over if p["level"] == level]
        return f"{(r[0] - 1) * 100:+.1f}%" if r and r[0] > 0 else "-"
    held = any(p.get("held") for p in over)  # launched together after the last stage
    rows.append(f"| {shape}{' (held)' if held else ''} | {run:.3f} ms | {cell('stats', 'run_ratio')} | "
                f"{cell('sketch', 'run_ratio')} | {wall:.3f} ms | {cell('stats', 'ratio')} | {cell('sketch', 'ratio')} |")
if rows:
    n = "/".join(str(x) for x in sorted(layers))
    print("\nprobe overhead on the layer's wall (targets: sketch <= +10%, <= +5% at prefill T 4096; stats <= +5%)")
    print(f"| shape | run of {n} layers: wall, no probes | stats | sketch | one layer alone: wall, no probes | stats "
          "| sketch |\n|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("(run: layers back to back, each layer's records taken by the end of the next one where they are held, "
          "else awaited at their layer's end; alone: one layer, synchronized, its records awaited at its end; held: "
          "probes held to the end of the layer and launched together, cuda:probe_launch=layer)")
PY
fi
# PyTorch anchors on the same GPU in the same call (bench/torch_anchor.py): the unfused absorbed decode, torch's
# sdpa and HF's DeepseekV3Attention layer, each beside our time as a ratio (> 1: ours is faster).
if [[ "${MLA_BENCH_ANCHOR:-1}" != 0 ]] && command -v python3 >/dev/null 2>&1; then
  dec=() pre=()
  for name in "${ran[@]}"; do
    case $name in *decode64) dec+=(64x4096) ;; *decode128) dec+=(128x8192) ;; prefill512) pre+=(512) ;;
      prefill4096|v3prefill4096|copyprefill4096) pre+=(4096) ;; v3prefill512) pre+=(512) ;; esac
  done
  mapfile -t dec < <(printf '%s\n' "${dec[@]}" | sort -u | grep .)
  mapfile -t pre < <(printf '%s\n' "${pre[@]}" | sort -u | grep .)
  if (( ${#dec[@]} + ${#pre[@]} > 0 )); then
    echo "=== gpu_bench: PyTorch anchors: bench/torch_anchor.py --decode ${dec[*]} --prefill ${pre[*]}" | tee -a "$log"
    if python3 bench/torch_anchor.py --json "$work/anchors.json" --decode "${dec[@]}" --prefill "${pre[@]}" 2>&1 |
        tee -a "$log"; then
      python3 - "$work" <<'PY' 2>&1 | tee -a "$log"
import json, os, sys
work = sys.argv[1]
anchor = json.load(open(os.path.join(work, "anchors.json")))
def ours(shape, stage):
    path = os.path.join(work, f"bench_{shape}.json")
    if not os.path.exists(path): return None
    j = json.load(open(path))
    if stage == "layer": return j["layer"]["time"]["median_s"]
    return next((s["time"]["median_s"] for s in j["stages"] if s["stage"] == stage), None)
rows = []
def row(shape, what, mine, theirs):
    if mine and theirs:
        rows.append(f"| {shape} | {what} | {mine * 1e3:.3f} ms | {theirs * 1e3:.3f} ms | {theirs / mine:.2f}x |")
for bl, r in anchor["decode"].items():
    shape = {"64x4096": "decode64", "128x8192": "decode128"}[bl]
    row(shape, "attention_mqa vs unfused einsum + softmax", ours(shape, "attention_mqa"), r["attention_s"])
    row("mqa2" + shape, "attention_mqa version 2 (mma.sync) vs the same", ours("mqa2" + shape, "attention_mqa"),
        r["attention_s"])
for t, r in anchor["prefill"].items():
    shape = f"prefill{t}"
    row(shape, "attention_mha vs torch sdpa", ours(shape, "attention_mha"), r["attention_s"])
    row(shape, "layer (x to h_out) vs HF DeepseekV3Attention (sdpa)", ours(shape, "layer"), r.get("layer_s"))
    row("v3" + shape, "attention_mha version 3 (mma.sync) vs torch sdpa", ours("v3" + shape, "attention_mha"),
        r["attention_s"])
    row("v3" + shape, "layer with version 3 vs HF DeepseekV3Attention", ours("v3" + shape, "layer"), r.get("layer_s"))
    row("copy" + shape, "layer with head_split=copy vs HF DeepseekV3Attention", ours("copy" + shape, "layer"),
        r.get("layer_s"))
if rows:
    print(f"\nagainst PyTorch {anchor['torch']} on {anchor['device']} (ratio: its time over ours)")
    print("| shape | what | ours | PyTorch | ratio |\n|---|---|---|---|---|")
    print("\n".join(rows))
PY
      (( PIPESTATUS[0] == 0 )) || { echo "gpu_bench: FAILED to tabulate the anchors" | tee -a "$log"; status=1; }
    fi
  fi
fi
tar -czf "$out/bench_json.tar.gz" -C "$work" $(cd "$work" && ls bench_*.json 2>/dev/null) 2>/dev/null
grep -q "FAILED" "$log" && status=1
exit $status
