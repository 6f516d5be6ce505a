#!/usr/bin/env bash
# Configures and builds mla-bisect into build/ (binary: build/mla-bisect).
#
#   ./scripts/build.sh [extra cmake configure args, e.g. -DMLA_WITH_CUDA=OFF]
#
# Env: MLA_SKIP_SETUP=1 skips scripts/setup.sh; BUILD_TYPE (default Release);
#      MLA_CMAKE_ARGS extra configure args (space-separated) for callers that cannot pass "$@";
#      MLA_BUILD_TARGETS targets to build (space-separated; default: all of them, the tests included);
#      MLA_BUILD_DIR the build folder (default build);
#      MLA_BUILD_QUIET=1 puts cmake's and the compiler's output in BUILD/configure.log and BUILD/build.log and prints
#      a line per fifth of the build instead (the last lines of the log when it fails). scripts/demo.sh sets it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${MLA_SKIP_SETUP:-0}" != 1 ]]; then
  ./scripts/setup.sh
fi

# The Python the tests use: the project venv when it has numpy and h5py (or python3 has them neither), else python3.
venv="$(./scripts/venv_path.sh)"
if [[ -x "$venv/bin/python" ]] && { "$venv/bin/python" -c 'import numpy, h5py' 2>/dev/null ||
                                    ! python3 -c 'import numpy, h5py' 2>/dev/null; }; then
  MLA_PYTHON="$venv/bin/python"
else
  MLA_PYTHON="$(command -v python3 || true)"
fi
export MLA_PYTHON

bdir="${MLA_BUILD_DIR:-build}"
# A cache made for another source folder (a build/ copied from elsewhere) makes cmake refuse; start over.
if [[ -f "$bdir/CMakeCache.txt" ]]; then
  cached_src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$bdir/CMakeCache.txt")"
  if [[ -n "$cached_src" && "$(cd "$cached_src" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]]; then
    echo "build: $bdir/ was configured for $cached_src; reconfiguring from scratch"
    rm -rf "$bdir/CMakeCache.txt" "$bdir/CMakeFiles"
  fi
fi

configure_args=(-S . -B "$bdir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}")
# An existing cache keeps its generator (cmake refuses a different one); a fresh one prefers Ninja.
if [[ ! -f "$bdir/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  configure_args+=(-G Ninja)
fi
if [[ -n "$MLA_PYTHON" ]]; then
  configure_args+=(-DMLA_PYTHON="$MLA_PYTHON" -DPython3_EXECUTABLE="$MLA_PYTHON")
fi
# shellcheck disable=SC2206  # MLA_CMAKE_ARGS is deliberately word-split
extra_env_args=(${MLA_CMAKE_ARGS:-})

# shellcheck disable=SC2206  # MLA_BUILD_TARGETS is deliberately word-split
targets=(${MLA_BUILD_TARGETS:-})
target_args=()
if (( ${#targets[@]} > 0 )); then target_args=(--target "${targets[@]}"); fi

jobs="$(nproc 2>/dev/null || echo 2)"
if [[ "${MLA_BUILD_QUIET:-0}" != 1 ]]; then
  cmake "${configure_args[@]}" "${extra_env_args[@]}" "$@"
  cmake --build "$bdir" -j"$jobs" "${target_args[@]}"
  exit 0
fi

# Quiet: the logs keep everything; a failure shows where it failed.
mkdir -p "$bdir"
fail() {  # fail WHAT LOG
  echo "build: $1 failed; the last lines of $2:" >&2
  tail -n 60 "$2" >&2
  exit 1
}
if ! cmake "${configure_args[@]}" "${extra_env_args[@]}" "$@" >"$bdir/configure.log" 2>&1; then
  fail "configuring $bdir" "$bdir/configure.log"
fi
echo "build: compiling into $bdir/ with $jobs jobs (log: $bdir/build.log)"
start=$SECONDS
# Ninja's "[k/N]" and make's "[ p%]" status lines give the progress; one line is printed per fifth done.
set +e
cmake --build "$bdir" -j"$jobs" "${target_args[@]}" 2>&1 | tee "$bdir/build.log" | awk '
  /^\[ *[0-9]+\/[0-9]+\]/ { s = $0; sub(/^\[ */, "", s); split(s, a, /[\/\]]/); p = int(100 * a[1] / a[2]) }
  /^\[ *[0-9]+%\]/         { s = $0; sub(/^\[ */, "", s); p = int(s) }
  p >= next_step && p < 100 { printf "build: %d%%\n", p; fflush(); next_step = (int(p / 20) + 1) * 20 }
  BEGIN { next_step = 20; p = 0 }'
rc=${PIPESTATUS[0]}
set -e
(( rc == 0 )) || fail "compiling" "$bdir/build.log"
warnings="$(grep -c 'warning:' "$bdir/build.log" || true)"
echo "build: done in $((SECONDS - start)) s$([[ "$warnings" != 0 ]] && echo ", $warnings compiler warnings in $bdir/build.log")"
