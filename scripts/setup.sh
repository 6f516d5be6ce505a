#!/usr/bin/env bash
# Installs what mla-bisect needs to build and test, and only what is missing; safe to run again.
# Works on a networked Debian 12 box (apt-get + PyPI) and on an offline GPU machine where everything is
# already installed system-wide: there it finds what is present and warns about the rest, never fails.
#
#   ./scripts/setup.sh          run it
#   . scripts/setup.sh          source it: same, then MLA_PYTHON is exported into the calling shell
#
# Env: PYTHON (base interpreter for the venv, default python3), MLA_SETUP_NO_APT=1, MLA_SETUP_NO_PIP=1,
#      MLA_VENV (where the venv lives; default ~/.cache/mla-bisect/venv, outside the clone: scripts/venv_path.sh),
#      MLA_SETUP_FOR=build: only what building and running mla-bisect needs (the compilers and libraries; no fuzzer
#      toolchain, no Python venv), what scripts/demo.sh asks for; the default (all) adds what the tests use.

# Sourced: do the work in a child shell so that set -e, cd and exit cannot reach the caller's shell.
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  bash "${BASH_SOURCE[0]}" "$@" || return $?
  _mla_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  _mla_venv="$("$_mla_root/scripts/venv_path.sh")"
  if [[ -x "$_mla_venv/bin/python" ]]; then
    export MLA_PYTHON="$_mla_venv/bin/python"
  fi
  unset _mla_venv
  unset _mla_root
  return 0
fi

set -euo pipefail
cd "$(dirname "$0")/.."

say()  { echo "setup: $*"; }
warn() { echo "setup: WARNING: $*" >&2; }

# ---------------------------------------------------------------------------------------------------
# Debian packages. A package counts as present if dpkg says so OR its files are there: the GPU machine
# has these libraries installed without (or outside) the Debian package database.
# ---------------------------------------------------------------------------------------------------
# clang, libclang-rt-dev (libFuzzer and the sanitizer runtimes) and libomp-dev (OpenMP for clang) build the fuzz
# targets that scripts/test.sh runs after the tests (scripts/fuzz.sh).
setup_for="${MLA_SETUP_FOR:-all}"
case "$setup_for" in
  all|build) ;;
  *) echo "setup: MLA_SETUP_FOR must be 'all' or 'build', not '$setup_for'" >&2; exit 2 ;;
esac
# libgtest-dev is in both: build/ is configured with the tests (CMake needs GTest), even when only mla-bisect is built.
DEB_PACKAGES=(cmake ninja-build g++ libeigen3-dev libhdf5-dev libcli11-dev nlohmann-json3-dev libgtest-dev)
if [[ "$setup_for" == all ]]; then
  DEB_PACKAGES+=(hdf5-tools python3-venv clang libclang-rt-dev libomp-dev chromium)
fi

dpkg_installed() {
  command -v dpkg-query >/dev/null 2>&1 &&
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

header_present() {  # header_present RELPATH: found under a usual include root
  local d
  for d in /usr/include /usr/local/include ${CONDA_PREFIX:+"$CONDA_PREFIX/include"}; do
    [[ -e "$d/$1" ]] && return 0
  done
  return 1
}

llvm_file_present() {  # llvm_file_present GLOB: a file of that name in an LLVM tree (Debian: /usr/lib/llvm-N)
  [[ -n "$(find /usr/lib/llvm-* /usr/local/lib /usr/lib/clang -name "$1" -print -quit 2>/dev/null)" ]]
}

files_present() {
  case "$1" in
    cmake)              command -v cmake >/dev/null 2>&1 ;;
    ninja-build)        command -v ninja >/dev/null 2>&1 ;;
    g++)                command -v g++ >/dev/null 2>&1 ;;
    libeigen3-dev)      header_present eigen3/Eigen/Core || header_present Eigen/Core ;;
    libhdf5-dev)        [[ -n "$(find /usr/include /usr/local/include -name hdf5.h -print -quit 2>/dev/null)" ]] ;;
    hdf5-tools)         command -v h5dump >/dev/null 2>&1 ;;
    libcli11-dev)       header_present CLI/CLI.hpp ;;
    nlohmann-json3-dev) header_present nlohmann/json.hpp ;;
    libgtest-dev)       header_present gtest/gtest.h || [[ -d /usr/src/googletest || -d /usr/src/gtest ]] ;;
    python3-venv)       "${PYTHON:-python3}" -c 'import venv, ensurepip' >/dev/null 2>&1 ;;
    # Any Debian clang version will do (scripts/fuzz.sh looks for clang++ and clang++-N).
    clang)              command -v clang++ >/dev/null 2>&1 || compgen -G '/usr/bin/clang++-[0-9]*' >/dev/null ;;
    libclang-rt-dev)    llvm_file_present 'libclang_rt.fuzzer*.a' ;;
    libomp-dev)         llvm_file_present 'libomp.so' ;;
    # Headless, it draws the HTML reports in a test (tests/py/test_html_report_browser.py).
    chromium)           command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
                          command -v google-chrome >/dev/null 2>&1 ;;
    *)                  return 1 ;;
  esac
}

missing_debs=()
for pkg in "${DEB_PACKAGES[@]}"; do
  if ! files_present "$pkg" && ! dpkg_installed "$pkg"; then
    missing_debs+=("$pkg")
  fi
done

if (( ${#missing_debs[@]} == 0 )); then
  say "debian packages: all present"
elif [[ "${MLA_SETUP_NO_APT:-0}" == 1 ]] || ! command -v apt-get >/dev/null 2>&1; then
  warn "missing and not installing (no apt-get or MLA_SETUP_NO_APT=1): ${missing_debs[*]}"
else
  sudo_cmd=()
  if (( EUID != 0 )); then
    if command -v sudo >/dev/null 2>&1; then
      sudo_cmd=(sudo)
    else
      sudo_cmd=(false)
    fi
  fi
  # Short timeouts: on a machine without network apt must give up quickly instead of hanging.
  apt_opts=(-q -o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)
  if [[ "${sudo_cmd[0]:-}" == false ]]; then
    warn "not root and no sudo; missing: ${missing_debs[*]}"
  else
    say "apt-get install ${missing_debs[*]}"
    apt_log="$(mktemp)"
    if "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update >"$apt_log" 2>&1 &&
       "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
         --no-install-recommends "${missing_debs[@]}" >>"$apt_log" 2>&1; then
      say "installed ${missing_debs[*]}"
    else
      warn "apt-get failed (offline?): $(grep -m1 '^E:' "$apt_log" || tail -n1 "$apt_log")"
      warn "still missing: ${missing_debs[*]}"
    fi
    rm -f "$apt_log"
  fi
fi

# ---------------------------------------------------------------------------------------------------
# Python: a venv in a cache folder outside the clone (scripts/venv_path.sh) with numpy, h5py, the independent
# file producers (gguf, safetensors, ml_dtypes) and HF transformers with torch (the capture tests run real HF MLA
# modules). Offline, the venv sees the system site-packages instead. Tests that need a missing module skip
# themselves.
# ---------------------------------------------------------------------------------------------------
if [[ "$setup_for" == build ]]; then
  say "python: not needed to build and run mla-bisect; skipped (MLA_SETUP_FOR=build)"
  exit 0
fi
PY_MODULES=(numpy h5py gguf safetensors ml_dtypes pytest torch transformers)   # import name == PyPI name for all
VENV="$(./scripts/venv_path.sh)"
mkdir -p "$(dirname "$VENV")"
VPY="$VENV/bin/python"
BASE_PY="${PYTHON:-python3}"

missing_modules() {  # prints the modules of PY_MODULES that $VPY cannot import, space-separated
  "$VPY" - "${PY_MODULES[@]}" <<'EOF' 2>/dev/null || echo "${PY_MODULES[*]}"
import importlib, sys
missing = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception:
        missing.append(m)
print(" ".join(missing))
EOF
}

make_venv() {  # make_venv [extra venv args]; falls back to a venv without pip (python3-venv absent)
  "$BASE_PY" -m venv "$@" "$VENV" >/dev/null 2>&1 ||
    "$BASE_PY" -m venv --without-pip "$@" "$VENV" >/dev/null 2>&1
}

if ! command -v "$BASE_PY" >/dev/null 2>&1; then
  warn "no $BASE_PY; Python-based tests will skip"
  exit 0
fi

if [[ -x "$VPY" ]] && "$VPY" -c '' >/dev/null 2>&1; then
  :
else
  # Absent, or broken (e.g. its interpreter moved): make it anew.
  say "creating $VENV"
  if ! make_venv --clear; then
    warn "could not create $VENV with $BASE_PY; Python-based tests will skip"
    exit 0
  fi
fi

missing="$(missing_modules)"
if [[ -z "$missing" ]]; then
  say "python modules in $VENV: all present"
  exit 0
fi

pip_ok=0
if [[ "${MLA_SETUP_NO_PIP:-0}" != 1 ]] && "$VPY" -m pip --version >/dev/null 2>&1; then
  pip_args=(install -q --disable-pip-version-check --retries 1 --timeout 15)
  [[ -d .whl ]] && pip_args+=(--find-links .whl)   # a local wheel cache, when one was carried along
  # One module at a time: torch (gigabytes, the first time) failing must not keep numpy and h5py out.
  pip_ok=1
  for m in $missing; do
    say "pip install $m"
    "$VPY" -m pip "${pip_args[@]}" "$m" >/dev/null 2>&1 || { warn "pip install $m failed"; pip_ok=0; }
  done
fi

if (( pip_ok == 0 )); then
  # Offline: let the venv see the system's packages (the GPU machine has numpy, h5py, torch there).
  if ! grep -qi '^include-system-site-packages *= *true' "$VENV/pyvenv.cfg" 2>/dev/null; then
    say "pip could not install; recreating $VENV with --system-site-packages"
    # No --clear: keeps what pip did manage to install; venv rewrites pyvenv.cfg in place.
    make_venv --system-site-packages || warn "could not recreate $VENV"
  fi
fi

missing="$(missing_modules)"
if [[ -z "$missing" ]]; then
  say "python modules in $VENV: all present"
else
  warn "python modules missing in $VENV (tests needing them will skip): $missing"
fi
exit 0
