#!/usr/bin/env bash
# Builds (scripts/build.sh) and runs the tests with ctest; exit code is ctest's.
#
#   ./scripts/test.sh              the cpu-labelled tests (what CI runs)
#   ./scripts/test.sh -L gpu       extra args go to ctest; a -L of your own replaces the default label
#   MLA_TEST_LABELS='cpu|slow' ./scripts/test.sh     label regex; MLA_TEST_LABELS= (empty) runs all
#
# Build options go through the environment: MLA_CMAKE_ARGS, BUILD_TYPE, MLA_SKIP_SETUP (see build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/build.sh

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

exec ctest --test-dir build --output-on-failure "${label_args[@]}" -j"$(nproc 2>/dev/null || echo 2)" "$@"
