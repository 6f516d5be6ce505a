#!/usr/bin/env bash
# On a machine with several GPUs (2, 4 or 8): the multi-GPU and one-process-per-rank runs, after
# scripts/gpu_check.sh built build-gpu/ (this script builds it when missing). With N = the GPUs visible:
#   1. the multi-GPU tests (ctest -R CudaMultiGpu): tp 2, 4, 8 with one GPU per rank (NCCL) where N allows,
#      more ranks than GPUs with the device-side sum (peer copies) otherwise, against the fp32 reference;
#   2. the zoo with the cuda candidate at tp = N on tiny and on DeepSeek-V3 dims (tp-head-offset and
#      allreduce-skip included), and a bisect of allreduce-skip at tp = N;
#   3. a stalled rank (hang-at:attention_mha@1): the run and a bisect must exit 3 within the watchdog timeout,
#      naming rank 1 and the stage;
#   4. the benchmark: DeepSeek-V3 prefill layer at T = 512, 4096, 16384 on 1 GPU (tp 1) and on N GPUs (tp N,
#      NCCL): the o_proj all-reduce's bus bandwidth next to the layer's time, and the layer's scaling;
#   5. GLM-5 at tp 8 (the seed's configuration), prefill and decode: a clean bisect must find nothing;
#   6. one process per rank (`run --rank auto --rendezvous FILE`, MLA_RANK/MLA_WORLD_SIZE set as a launcher
#      would): N processes on the N GPUs, NCCL joined through the file; their per-rank dumps read as one set
#      must equal the one-process tp N run bit for bit (prefill at DeepSeek-V3 dims, decode on tiny); and a
#      stalled rank: every process exits 3 within the watchdog timeout, rank 1's report naming attention_mha.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). Log: $OUT/multi_gpu.log (else build-gpu/multi_gpu.log).
#   MLA_MULTI_ONLY='tests zoo hang bench glm5 procs'   which parts run (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

log_dir="${OUT:-build-gpu}"
mkdir -p "$log_dir"
log="$log_dir/multi_gpu.log"
bin="$PWD/build-gpu/mla-bisect"
work=build-gpu/multi
only=" ${MLA_MULTI_ONLY:-tests zoo hang bench glm5 procs} "

run_all() {
  local status=0 t0
  echo "multi_gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -n 12
  local n
  n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
  echo "multi_gpu_check: $n GPUs"
  if [[ "$n" -lt 2 ]]; then
    echo "multi_gpu_check: FAILED: needs at least 2 GPUs"
    return 1
  fi
  if [[ ! -x "$bin" || ! -x build-gpu/tests/mla_gpu_tests ]]; then
    MLA_GPU_CHECK_CPU=0 MLA_GPU_CHECK_ZOO=0 MLA_GPU_TEST_REGEX=CudaMultiGpu ./scripts/gpu_check.sh ||
      { echo "multi_gpu_check: FAILED: build"; return 1; }
  fi
  mkdir -p "$work"
  # check NAME CMD...: runs CMD, says what it exited with; failure marks the run failed.
  check() {
    local name=$1 rc=0
    shift
    local s=$SECONDS
    "$@" || rc=$?
    echo "multi_gpu_check: $name: exit $rc ($((SECONDS - s)) s)"
    [[ $rc == 0 ]] || { echo "multi_gpu_check: FAILED: $name"; status=1; }
  }

  if [[ $only == *" tests "* ]]; then
    check "multi-GPU tests" ctest --test-dir build-gpu -R 'CudaMultiGpu' --output-on-failure --timeout 900
  fi

  if [[ $only == *" zoo "* ]]; then
    check "zoo cuda tiny tp $n" "$bin" zoo --candidate cuda --model tiny --tp "$n" --workdir "$work/zoo-tiny"
    check "zoo cuda deepseek-v3 tp $n" "$bin" zoo --candidate cuda --model deepseek-v3 --tokens 16 --tp "$n" \
      --clean-seeds 1 --only tp-head-offset,allreduce-skip,rope-neox,softmax-scale,kv-b-split \
      --workdir "$work/zoo-dsv3"
    local rc=0
    "$bin" bisect --candidate cuda --model deepseek-v3 --tokens 32 --tp "$n" --inject allreduce-skip \
      --workdir "$work/bisect-allreduce" --brief || rc=$?
    echo "multi_gpu_check: bisect allreduce-skip at tp $n: exit $rc (1 = divergence found)"
    [[ $rc == 1 ]] || { echo "multi_gpu_check: FAILED: bisect allreduce-skip"; status=1; }
  fi

  if [[ $only == *" hang "* ]]; then
    local out rc s
    for cmd in run bisect; do
      s=$SECONDS
      rc=0
      if [[ $cmd == run ]]; then
        out="$(timeout 120 "$bin" run --engine cuda --model tiny --tokens 8 --tp "$n" --inject hang-at:attention_mha@1 \
               --watchdog 10 --out "$work/hang.h5" --quiet 2>&1)" || rc=$?
      else
        out="$(timeout 300 "$bin" bisect --candidate cuda --model tiny --tokens 8 --tp "$n" \
               --inject hang-at:attention_mha@1 --timeout 10 --workdir "$work/bisect-hang" --brief 2>&1)" || rc=$?
      fi
      echo "$out" | tail -n 8
      echo "multi_gpu_check: stalled rank ($cmd): exit $rc after $((SECONDS - s)) s"
      if [[ $rc != 3 ]] || ! grep -q "rank 1" <<<"$out" || ! grep -q "attention_mha" <<<"$out"; then
        echo "multi_gpu_check: FAILED: stalled rank ($cmd): expected exit 3 naming rank 1 and attention_mha"
        status=1
      fi
    done
    "$bin" inspect "$work/hang.h5" 2>&1 | head -n 12
  fi

  if [[ $only == *" bench "* ]]; then
    local T
    for T in 512 4096 16384; do
      for tp in 1 "$n"; do
        echo "=== bench deepseek-v3 prefill T=$T tp $tp over $tp GPU(s)"
        "$bin" bench --engine "cuda:poison=0,devices=$tp" --model deepseek-v3 --mode prefill --tokens "$T" --tp "$tp" \
          --repeats 10 --probe-level sketch --probe-repeats 2 --json "$work/bench_T${T}_tp${tp}.json" 2>&1 |
          grep -E "^(bench|device|ceiling|stage|layer|o_proj|all_reduce|attention_mha|\(layer|probe)" ||
          { echo "multi_gpu_check: FAILED: bench T=$T tp $tp"; status=1; }
      done
    done
    echo "=== scaling (layer, host wall synchronized, probes off)"
    for T in 512 4096 16384; do
      python3 - "$work/bench_T${T}_tp1.json" "$work/bench_T${T}_tp${n}.json" "$T" "$n" <<'PY' || true
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
def wall(j): return j["layer"]["wall"]["median_s"] * 1e3
T, n = sys.argv[3], sys.argv[4]
print(f"T={T}: tp 1 {wall(a):.3f} ms, tp {n} over {n} GPUs {wall(b):.3f} ms: speedup {wall(a)/wall(b):.2f}x (ideal {n}x)")
PY
    done
  fi

  if [[ $only == *" glm5 "* ]]; then
    for mode in prefill decode; do
      local extra=(--tokens 32)
      [[ $mode == decode ]] && extra=(--batch 4 --context 200)
      check "GLM-5 tp 8 $mode: clean bisect" "$bin" bisect --candidate "cuda:devices=$n" --model glm-5 --tp 8 \
        --mode "$mode" "${extra[@]}" --workdir "$work/glm5-$mode" --brief
    done
  fi
  if [[ $only == *" procs "* ]]; then
    # launch NAME ARGS...: one process per rank in the background, as a launcher would; waits for all, prints each
    # one's exit status and last lines, and sets the array `rcs`.
    launch() {
      local name=$1 r pids=()
      shift
      rm -f "$work/$name.rdv"
      for ((r = 0; r < n; ++r)); do
        MLA_RANK=$r MLA_WORLD_SIZE=$n timeout 300 "$bin" run --engine cuda --tp "$n" --rank auto \
          --rendezvous "$work/$name.rdv" --rendezvous-timeout 60 "$@" >"$work/$name.rank$r.log" 2>&1 &
        pids+=($!)
      done
      rcs=()
      for ((r = 0; r < n; ++r)); do
        local rc=0
        wait "${pids[$r]}" || rc=$?
        rcs+=("$rc")
        echo "  rank $r: exit $rc; last lines:"
        tail -n 3 "$work/$name.rank$r.log" | sed 's/^/    /'
      done
    }
    local spec
    for spec in "dsv3-prefill|--model deepseek-v3 --tokens 32" "tiny-decode|--model tiny --mode decode --batch 2 --context 40,90"; do
      local name="${spec%%|*}" args="${spec#*|}" s=$SECONDS
      echo "=== one process per rank: $name, $n processes"
      # shellcheck disable=SC2086
      launch "$name" $args --out "$work/$name-per.h5" --quiet
      local ok=1
      for rc in "${rcs[@]}"; do [[ $rc == 0 ]] || ok=0; done
      echo "multi_gpu_check: per-process $name: exits ${rcs[*]} ($((SECONDS - s)) s)"
      [[ $ok == 1 ]] || { echo "multi_gpu_check: FAILED: per-process $name"; status=1; continue; }
      # shellcheck disable=SC2086
      check "one-process tp $n $name" "$bin" run --engine cuda --tp "$n" $args --out "$work/$name-one.h5" --quiet
      check "per-rank dumps of $name equal the one-process dump bit for bit" \
        "$bin" compare "$work/$name-one.h5" "$work/$name-per.h5" --tolerance exact
    done
    echo "=== one process per rank: stalled rank 1 (hang-at:attention_mha@1, watchdog 10 s)"
    local s=$SECONDS
    launch hang --model tiny --tokens 8 --inject hang-at:attention_mha@1 --watchdog 10 --out "$work/hang-per.h5" --quiet
    echo "multi_gpu_check: per-process stalled rank: exits ${rcs[*]} after $((SECONDS - s)) s"
    local bad=0
    for rc in "${rcs[@]}"; do [[ $rc == 3 ]] || bad=1; done
    grep -q "rank 1" "$work/hang.rank1.log" && grep -q "attention_mha" "$work/hang.rank1.log" || bad=1
    [[ $bad == 0 ]] || { echo "multi_gpu_check: FAILED: per-process stalled rank: expected every exit 3, rank 1 naming attention_mha"; status=1; }
    "$bin" inspect "$work/hang-per.rank1.h5" 2>&1 | head -n 6
  fi
  [[ $status == 0 ]] && echo "multi_gpu_check: OK"
  return $status
}

run_all 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
