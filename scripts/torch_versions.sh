#!/usr/bin/env bash
# The torch versions the [torch] extra admits (torch>=2.9), oldest and newest, each in a
# throwaway venv: the importer's, the wrapper's and the messages' tests against it.
#
#   scripts/torch_versions.sh                 # 2.9.0 and 2.13.0
#   scripts/torch_versions.sh 2.13.0          # just these versions
#
# TESTS="tests/test_wrap.py ..." runs other test files.  Wheels come from $WHEELS
# (default /opt/wheels) when a file for the version is there, else from pip's index (the
# CPU wheels: $TORCH_INDEX, default https://download.pytorch.org/whl/cpu; where only PyPI
# is reachable, TORCH_INDEX=https://pypi.org/simple installs PyPI's CUDA build and its
# nvidia-* libraries, which run on the CPU as well).  Each venv sees
# this checkout by PYTHONPATH (no install), and is deleted afterwards.  SYSTEM_SITE=1:
# the venvs see this Python's installed packages (numpy, pytest, torch's dependencies), and
# only torch itself goes into the venv (no downloads where its wheel is in $WHEELS).  Exit
# status: 0 when every version passed; the summary line per version says which failed.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(2.9.0 2.13.0)
wheels="${WHEELS:-/opt/wheels}"
index="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
read -r -a tests <<< "${TESTS:-tests/test_interop_torch.py tests/test_import_models.py tests/test_import_functional.py tests/test_import_check.py tests/test_import_random.py tests/test_import_complex.py tests/test_wrap.py tests/test_wrap_handoff.py tests/test_wrap_optim.py tests/test_interop_messages.py}"
py="${PYTHON:-python3}"
status=0
summary=()
for v in "${versions[@]}"; do
    env_dir="$(mktemp -d)"
    echo "== torch $v in $env_dir"
    venv=("$py" -m venv)
    [ -n "${SYSTEM_SITE:-}" ] && venv+=(--system-site-packages)
    if ! "${venv[@]}" "$env_dir"; then
        summary+=("torch $v: FAILED (venv)"); status=1; rm -rf "$env_dir"; continue
    fi
    pip=("$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check)
    wheel="$(ls "$wheels"/torch-"$v"[+-]*.whl 2>/dev/null | head -n 1)"
    if [ -n "$wheel" ]; then
        got=("${pip[@]}" "$wheel")
    else
        got=("${pip[@]}" "torch==$v" --index-url "$index" --extra-index-url https://pypi.org/simple)
    fi
    deps=("${pip[@]}" "numpy>=1.23" "msgpack>=1.0" "click>=8.0" "jsonschema>=4.0" "pytest>=7"
          "mpmath>=1.2")
    if [ -n "${SYSTEM_SITE:-}" ]; then      # torch alone, into the venv
        got+=(--ignore-installed --no-deps)
        deps=(true)
    fi
    if ! "${got[@]}" || ! "${deps[@]}"; then
        summary+=("torch $v: FAILED (install)"); status=1; rm -rf "$env_dir"; continue
    fi
    echo "== $("$env_dir/bin/python" -c 'import torch; print("torch", torch.__version__, "from", torch.__file__)')"
    if (cd "$root" && PYTHONPATH="$root" "$env_dir/bin/python" -m pytest -q -p no:cacheprovider \
            "${tests[@]}"); then
        summary+=("torch $v: passed")
    else
        summary+=("torch $v: FAILED (tests)"); status=1
    fi
    rm -rf "$env_dir"
done
printf '%s\n' "${summary[@]}"
exit $status
