#!/usr/bin/env bash
# Builds (scripts/build.sh), runs the tests with ctest, then fuzzes the file parsers (scripts/fuzz.sh: libFuzzer
# under ASan/UBSan, MLA_FUZZ_SECONDS per target). This is what CI runs (.ci/run).
#
#   ./scripts/test.sh              the cpu-labelled tests, then the fuzzers
#   ./scripts/test.sh -L gpu       extra args go to ctest (and skip the fuzzers); a -L of your own replaces the
#                                  default label
#   MLA_TEST_LABELS='cpu|slow' ./scripts/test.sh     label regex; MLA_TEST_LABELS= (empty) runs all
#   MLA_FUZZ_SECONDS=0 ./scripts/test.sh             skip the fuzzers (locally; CI always runs them)
#   MLA_FUZZ_SECONDS=300 ./scripts/test.sh           fuzz each target longer (default 45 s)
#
# Build options go through the environment: MLA_CMAKE_ARGS, BUILD_TYPE, MLA_SKIP_SETUP (see build.sh).
# Exit status: ctest's when it fails, else fuzz.sh's (1 a finding, 2 the fuzzers could not be built).
set -euo pipefail
cd "$(dirname "$0")/.."

# Every target: the test binaries, and mla-bisect, which they run. The packages the tests use too (Python, clang).
MLA_SETUP_FOR=all MLA_BUILD_DIR=build MLA_BUILD_TARGETS= ./scripts/build.sh

label_args=()
user_sets_label=0
for arg in "$@"; do
  case "$arg" in
    -L|-L*|--label-regex|--label-regex=*) user_sets_label=1 ;;
  esac
done
labels="${MLA_TEST_LABELS-cpu}"
if (( user_sets_label == 0 )) && [[ -n "$labels" ]]; then
  label_args=(-L "$labels")
fi

rc=0
ctest --test-dir build --output-on-failure "${label_args[@]}" -j"$(nproc 2>/dev/null || echo 2)" "$@" || rc=$?

# The fuzzers belong to the full run (CI's, with no arguments); a run narrowed by ctest arguments skips them.
fuzz_seconds="${MLA_FUZZ_SECONDS:-45}"
if (( $# > 0 )); then
  echo "test: fuzzers not run (ctest arguments given; ./scripts/test.sh without arguments runs them)"
elif [[ "$fuzz_seconds" == 0 ]]; then
  echo "test: fuzzers skipped (MLA_FUZZ_SECONDS=0; CI runs them)"
else
  t0=$SECONDS
  fuzz_rc=0
  # setup.sh has run already (build.sh), unless the caller skipped it.
  MLA_SKIP_SETUP=1 ./scripts/fuzz.sh "$fuzz_seconds" || fuzz_rc=$?
  case $fuzz_rc in
    0) echo "test: fuzzers passed ($((SECONDS - t0)) s)" ;;
    1) echo "test: FAILED: a fuzzer found a crashing input (see the fuzz: lines above)" >&2 ;;
    *) echo "test: FAILED: the fuzzers could not be built or one is missing (see the fuzz: lines above)" >&2 ;;
  esac
  if (( rc == 0 )); then rc=$fuzz_rc; fi
fi
if (( rc != 0 )); then echo "test: FAILED (exit $rc)" >&2; fi
exit "$rc"
