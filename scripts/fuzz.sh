#!/usr/bin/env bash
# Fuzzes the untrusted-input parsers: the safetensors header, GGUF, HF config.json, and the dump reader (dump: valid
# HDF5 dumps edited through HDF5 as the input says, their journals and rank sets; tests/fuzz). Builds the
# libFuzzer targets with clang, ASan and UBSan into build-fuzz/ (scripts/setup.sh installs Debian's clang,
# libclang-rt-dev and libomp-dev when they are missing) and runs each for a bounded time, starting from the seed
# corpora in tests/fuzz/corpus/. scripts/test.sh runs it after the tests (CI: 45 s per target).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     default 60 (or $MLA_FUZZ_SECONDS)
#
# Env: MLA_SKIP_SETUP=1 skips scripts/setup.sh; MLA_FUZZ_BUILD=DIR builds there instead of build-fuzz/.
# Exit status: 0 when every target ran its time without a finding; 1 on a finding (the input that triggered
# it is in build-fuzz/artifacts/); 2 when the fuzzers cannot be built (no clang, no libFuzzer runtime, a build
# error). A missing fuzzer is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-${MLA_FUZZ_SECONDS:-60}}"
TARGETS=(safetensors gguf config dump)
BUILD="${MLA_FUZZ_BUILD:-build-fuzz}"

say() { echo "fuzz: $*"; }
die() { echo "fuzz: ERROR: $*" >&2; exit 2; }

find_clang() {
  local v
  for v in "" -19 -18 -17 -16 -15 -14; do
    if command -v "clang++$v" >/dev/null 2>&1 && command -v "clang$v" >/dev/null 2>&1; then
      CXX_BIN="$(command -v "clang++$v")"
      CC_BIN="$(command -v "clang$v")"
      return 0
    fi
  done
  return 1
}

# Every target in tests/fuzz must be listed here, and every listed one must exist: none is dropped silently.
for src in tests/fuzz/fuzz_*.cpp; do
  name="$(basename "$src" .cpp)"
  [[ " ${TARGETS[*]/#/fuzz_} " == *" $name "* ]] || die "$src is not in TARGETS of scripts/fuzz.sh (add it there)"
done
for t in "${TARGETS[@]}"; do
  [[ -f "tests/fuzz/fuzz_$t.cpp" ]] || die "fuzzer tests/fuzz/fuzz_$t.cpp is missing"
done
[[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ && "$SECONDS_PER_TARGET" -gt 0 ]] ||
  die "the time per target must be a positive number of seconds, got '$SECONDS_PER_TARGET'"
if [[ "${MLA_SKIP_SETUP:-0}" != 1 ]]; then
  ./scripts/setup.sh
fi
find_clang || die "no clang++ on PATH (scripts/setup.sh installs Debian's clang; by hand: apt-get install clang" \
                  "libclang-rt-dev libomp-dev)"
# libFuzzer's driver and the sanitizer runtimes are a separate Debian package (only recommended by clang).
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe_dir/t.cpp"
"$CXX_BIN" -fsanitize=fuzzer,address,undefined "$probe_dir/t.cpp" -o "$probe_dir/t" >"$probe_dir/log" 2>&1 ||
  { cat "$probe_dir/log" >&2; die "$CXX_BIN cannot link a libFuzzer target (-fsanitize=fuzzer,address,undefined):" \
                                 "the runtime is missing (apt-get install libclang-rt-dev)"; }
say "compiler $CXX_BIN ($("$CXX_BIN" --version | head -n1))"

# Coverage instrumentation and the sanitizers for everything the targets link; -fsanitize=fuzzer (the
# driver) only on the targets themselves (tests/fuzz/CMakeLists.txt).
SAN="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_C_FLAGS="$SAN" \
  -DMLA_WITH_CUDA=OFF -DMLA_BUILD_FUZZERS=ON >"$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; die "cmake configure failed"; }
cmake --build "$BUILD" --target "${TARGETS[@]/#/fuzz_}" -j"$(nproc)" || die "building the fuzz targets failed"

mkdir -p "$BUILD/artifacts"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD/tests/fuzz/fuzz_$t"
  [[ -x "$bin" ]] || die "fuzzer $bin was not built"
  seeds="tests/fuzz/corpus/$t"
  [[ -d "$seeds" ]] || die "no seed corpus $seeds"
  work="$BUILD/corpus/$t"  # grows across runs; the committed seeds stay as they are
  mkdir -p "$work"
  say "fuzz_$t for ${SECONDS_PER_TARGET} s ($(ls "$seeds" | wc -l) seeds)"
  # -malloc_limit_mb: one allocation beyond 64 MiB from an input of at most 64 KiB is a finding (the parsers
  # must not allocate more than the file justifies). -timeout: a single input taking 10 s is a finding.
  if ! "$bin" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
       -malloc_limit_mb=64 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$t-" "$work" "$seeds" \
       >"$BUILD/fuzz_$t.log" 2>&1; then
    status=1
    echo "fuzz: FAILED: fuzz_$t found an input that crashes, trips a sanitizer, leaks, hangs or allocates too" \
         "much; reproduce with: $bin $(ls -t "$BUILD/artifacts/$t-"* 2>/dev/null | head -n1 || echo '<artifact>')" >&2
    echo "fuzz: last lines of $BUILD/fuzz_$t.log:" >&2
    tail -n 40 "$BUILD/fuzz_$t.log" >&2
  else
    say "fuzz_$t: $(grep -aE '^stat::number_of_executed_units' "$BUILD/fuzz_$t.log" | awk '{print $2}') runs, no finding"
  fi
done
exit "$status"
