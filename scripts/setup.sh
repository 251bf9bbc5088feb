#!/usr/bin/env bash
# Create .venv with Python >= 3.12 and install the locked dependencies; quick when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local candidates=()
  [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
  candidates+=(python3.12 python3.13 python3.14 python3)
  for py in "${candidates[@]}"; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

venv=.venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
  py=$(find_python) || { echo "error: dp_jax needs Python >= 3.12; install it (or set PYTHON=/path/to/python3.12) and rerun" >&2; exit 1; }
  echo "setup: creating $venv with $($py --version)"
  rm -rf "$venv"
  "$py" -m venv "$venv"
fi

stamp="$venv/.dp_jax-lock"
want=$(cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing locked dependencies (first run takes a few minutes)"
  log="$venv/setup.log"
  pip_install() { "$venv/bin/python" -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1 \
    || { echo "error: pip install $* failed; see $log" >&2; tail -n 20 "$log" >&2; exit 1; }; }
  : > "$log"
  # The venv's own pip (Python >= 3.12 bundles pip >= 23: every locked wheel installs) rather than
  # an unpinned upgrade.
  pip_install --no-compile -r requirements.lock
  pip_install --no-compile --no-deps -e .
  # pip byte-compiles what it installs one file after another; compileall's workers (one per
  # core) take about half the time. A file that does not compile is compiled (and fails) only
  # if imported, as under pip.
  "$venv/bin/python" -m compileall -q -j 0 "$("$venv/bin/python" -c \
    'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >>"$log" 2>&1 || true
  echo "$want" > "$stamp"
fi
# The project's own modules byte-compiled now (changed files only): with PYTHONDONTWRITEBYTECODE
# set, as on some machines and CIs, every app process would otherwise compile them from source.
"$venv/bin/python" -m compileall -q dp_jax experiments examples >/dev/null
