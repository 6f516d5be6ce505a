#!/usr/bin/env bash
# Fuzzes the untrusted-input parsers: the safetensors header, GGUF, and HF config.json (tests/fuzz). Builds the
# libFuzzer targets with clang, ASan and UBSan into build-fuzz/ (installing clang from Debian when it is
# missing) and runs each for a bounded time, starting from the seed corpora in tests/fuzz/corpus/.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     default 60 (or $MLA_FUZZ_SECONDS)
#
# Exit status: 0 when every target ran its time without a finding; 1 on a finding (the input that triggered
# it is in build-fuzz/artifacts/); 2 when the fuzzers cannot be built (no clang, build error). A missing
# fuzzer is a failure, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-${MLA_FUZZ_SECONDS:-60}}"
TARGETS=(safetensors gguf config)
BUILD=build-fuzz

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

if ! find_clang; then
  say "no clang; installing Debian's clang"
  sudo_cmd=()
  if (( EUID != 0 )); then
    command -v sudo >/dev/null 2>&1 || die "clang is missing and this is not root (no sudo): apt-get install clang"
    sudo_cmd=(sudo)
  fi
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Acquire::Retries=0 update >/dev/null ||
    die "apt-get update failed"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends clang libomp-dev >/dev/null ||
    die "apt-get install clang libomp-dev failed"
  find_clang || die "clang still not found after installing it"
fi
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
    echo "fuzz: FINDING in fuzz_$t; last lines of $BUILD/fuzz_$t.log:" >&2
    tail -n 40 "$BUILD/fuzz_$t.log" >&2
  else
    say "fuzz_$t: $(grep -E '^stat::number_of_executed_units' "$BUILD/fuzz_$t.log" | awk '{print $2}') runs, no finding"
  fi
done
exit "$status"
