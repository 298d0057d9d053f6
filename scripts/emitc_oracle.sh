#!/usr/bin/env bash
# emitc_oracle.sh TAPE... -- prove `gradtool emit-cuda` bit-exact against the CPU tape.
#
# For each scalar TAPE: emit it (with the --kernel wrapper, so nvcc compiles
# everything), compile it with gcc together with a generated host harness that
# evaluates it at the tape's recorded leaf values, and compare the loss and every
# gradient, bit for bit, with `gradtool backward TAPE --json --hex`.  Where nvcc
# is on PATH the emitted file must also pass `nvcc -c -arch=sm_90`.
#
# Exit status: 0 every bit equal; 1 a differing bit (the line names the tape,
# parameter and node) or a compiler rejecting emitted code; 2 bad input or
# usage (unreadable or non-scalar tape, no C compiler).
#
# Environment: CC (default cc), NVCC (default nvcc; NVCC=none skips it),
# PYTHON (default python3), GRADTOOL (default gradtool).
set -u

here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
GRADTOOL=${GRADTOOL:-gradtool}
CC=${CC:-cc}
NVCC=${NVCC:-nvcc}

die() { echo "emitc_oracle: $2" >&2; exit "$1"; }

[ $# -ge 1 ] || die 2 "usage: emitc_oracle.sh TAPE..."
command -v "$CC" >/dev/null 2>&1 || die 2 "no C compiler '$CC' on PATH"
use_nvcc=0
if [ "$NVCC" != none ] && command -v "$NVCC" >/dev/null 2>&1; then use_nvcc=1; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/emitc_oracle.XXXXXX") || die 2 "cannot create a temp dir"
trap 'rm -rf "$work"' EXIT

first_line() { grep -m1 -E 'error|Error' "$1" || head -n1 "$1"; }

checked=0
for tape in "$@"; do
    [ -f "$tape" ] && [ -r "$tape" ] || die 2 "$tape: no such readable file"
    cu="$work/grad.cu"
    # emit-cuda prints its own one-line reason (e.g. the first non-scalar node)
    "$GRADTOOL" emit-cuda --kernel "$tape" -o "$cu" || exit 2
    "$PYTHON" "$here/emitc_harness.py" harness "$tape" "$cu" > "$work/main.c" || exit 2
    if ! "$CC" -std=c99 -O2 -ffp-contract=off -o "$work/main" "$work/main.c" -lm \
            2> "$work/cc.log"; then
        die 1 "$tape: $CC rejected the emitted code: $(first_line "$work/cc.log")"
    fi
    "$work/main" > "$work/c.txt" || die 1 "$tape: the compiled harness failed to run"
    "$GRADTOOL" backward "$tape" --json --hex > "$work/ref.json" || exit 2
    "$PYTHON" "$here/emitc_harness.py" compare "$tape" "$work/c.txt" "$work/ref.json"
    status=$?
    [ "$status" -eq 0 ] || exit "$status"
    how="gcc"
    if [ "$use_nvcc" -eq 1 ]; then
        if ! "$NVCC" -c -arch=sm_90 -x cu -o "$work/grad.o" "$cu" 2> "$work/nvcc.log"; then
            die 1 "$tape: nvcc rejected the emitted code: $(first_line "$work/nvcc.log")"
        fi
        how="gcc, nvcc -c ok"
    fi
    echo "emitc_oracle: $tape: loss and gradients bit-identical ($how)"
    checked=$((checked + 1))
done
[ "$use_nvcc" -eq 1 ] || echo "emitc_oracle: nvcc not on PATH; CUDA compile step skipped"
echo "emitc_oracle: $checked tape(s) OK"
