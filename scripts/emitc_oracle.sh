#!/usr/bin/env bash
# emitc_oracle.sh -- prove `gradtool emit-cuda` bit-exact against the CPU tape.
#
#   emitc_oracle.sh TAPE...
#       The gradtool ABI.  For each scalar TAPE: emit it (with the --kernel
#       wrapper, so nvcc compiles everything), compile it with gcc together with a
#       generated host harness that evaluates it at the tape's recorded leaf
#       values, and compare the loss and every gradient, bit for bit, with
#       `gradtool backward TAPE --json --hex`.
#
#   emitc_oracle.sh --swarm [-n N] [--seed S] [--params LIST] [--bind NAME=EXPR]...
#                   [--no-v] [--random-plan] TAPE...
#       The swarm ABI, as swarm-mcp's compute_iterate runs it.  For each TAPE:
#       `gradtool emit-cuda --abi swarm` with the given --params/--bind/--no-v
#       (or, with --random-plan, a random param subset and random bindings per
#       tape from `emitc_harness.py swarm-plan`); a dataset of N (x, v) pairs
#       (default 64; x a small integer, v near the recorded value of the leaf
#       bound to v); scripts/swarm_driver.c, which defines swarm_g_add and sums
#       grad(x, v, g, p) over the dataset, compiled with gcc; and a bit
#       comparison of every sum with `gradtool backward TAPE --data DATA.npz
#       --json --hex`, which replays the same examples one at a time in the same
#       order.  Bindings must be v, x or (double)x: the harness evaluates them.
#
# Where nvcc is on PATH the emitted file must also pass `nvcc -c -arch=sm_90`
# (in swarm mode: the bare file, and the driver built as CUDA, which makes nvcc
# generate the device code of grad()).
#
# Exit status: 0 every bit equal; 1 a differing bit (the line names the tape,
# parameter and node) or a compiler rejecting emitted code; 2 bad input or
# usage (unreadable or non-scalar tape, a binding the oracle cannot evaluate,
# no C compiler).
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

swarm=0; n=64; seed=0; random_plan=0
emit_opts=(); tapes=()
while [ $# -gt 0 ]; do
    case "$1" in
        --swarm) swarm=1 ;;
        --random-plan) random_plan=1 ;;
        --no-v) emit_opts+=("--no-v") ;;
        -n|--seed|--params|--bind)
            [ $# -ge 2 ] || die 2 "$1 needs a value"
            case "$1" in
                -n) n=$2 ;;
                --seed) seed=$2 ;;
                *) emit_opts+=("$1" "$2") ;;
            esac
            shift ;;
        --) shift; tapes+=("$@"); break ;;
        -*) die 2 "unknown option $1" ;;
        *) tapes+=("$1") ;;
    esac
    shift
done

[ ${#tapes[@]} -ge 1 ] || die 2 "usage: emitc_oracle.sh [--swarm [options]] TAPE..."
if [ "$swarm" -eq 0 ] && { [ ${#emit_opts[@]} -gt 0 ] || [ "$random_plan" -eq 1 ]; }; then
    die 2 "--params, --bind, --no-v and --random-plan need --swarm"
fi
if [ "$random_plan" -eq 1 ] && [ ${#emit_opts[@]} -gt 0 ]; then
    die 2 "--random-plan chooses --params and --bind itself; give one or the other"
fi
command -v "$CC" >/dev/null 2>&1 || die 2 "no C compiler '$CC' on PATH"
use_nvcc=0
if [ "$NVCC" != none ] && command -v "$NVCC" >/dev/null 2>&1; then use_nvcc=1; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/emitc_oracle.XXXXXX") || die 2 "cannot create a temp dir"
trap 'rm -rf "$work"' EXIT

first_line() { grep -m1 -E 'error|Error' "$1" || head -n1 "$1"; }

nvcc_check() {   # nvcc_check TAPE FILE [nvcc args...]: the file must compile
    local tape=$1 file=$2
    shift 2
    if ! "$NVCC" -c -arch=sm_90 -x cu "$@" -o "$work/nvcc.o" "$file" 2> "$work/nvcc.log"; then
        die 1 "$tape: nvcc rejected $(basename "$file"): $(first_line "$work/nvcc.log")"
    fi
}

check_gradtool_abi() {
    local tape=$1 cu="$work/grad.cu"
    # emit-cuda prints its own one-line reason (e.g. the first non-scalar node)
    "$GRADTOOL" emit-cuda --kernel "$tape" -o "$cu" || exit 2
    "$PYTHON" "$here/emitc_harness.py" harness "$tape" "$cu" > "$work/main.c" || exit 2
    if ! "$CC" -std=c99 -O2 -ffp-contract=off -o "$work/main" "$work/main.c" -lm \
            2> "$work/cc.log"; then
        die 1 "$tape: $CC rejected the emitted code: $(first_line "$work/cc.log")"
    fi
    "$work/main" > "$work/c.txt" || die 1 "$tape: the compiled harness failed to run"
    "$GRADTOOL" backward "$tape" --json --hex > "$work/ref.json" || exit 2
    "$PYTHON" "$here/emitc_harness.py" compare "$tape" "$work/c.txt" "$work/ref.json" || exit $?
    [ "$use_nvcc" -eq 0 ] || nvcc_check "$tape" "$cu"
    echo "emitc_oracle: $tape: loss and gradients bit-identical ($how)"
}

check_swarm_abi() {
    local tape=$1 tape_seed=$2 cu="$work/swarm_grad.cu" plan=() no_v=()
    if [ "$random_plan" -eq 1 ]; then
        mapfile -t plan < <("$PYTHON" "$here/emitc_harness.py" swarm-plan "$tape" \
                            --seed "$tape_seed") || exit 2
        [ ${#plan[@]} -gt 0 ] && [ -n "${plan[0]}" ] || plan=()
    else
        plan=(${emit_opts[@]+"${emit_opts[@]}"})
    fi
    case " ${plan[*]-} " in *" --no-v "*) no_v=(-DSWARM_NO_V) ;; esac
    "$GRADTOOL" emit-cuda --abi swarm ${plan[@]+"${plan[@]}"} "$tape" -o "$cu" || exit 2
    "$PYTHON" "$here/emitc_harness.py" swarm-data "$tape" "$work/driver.txt" "$work/data.npz" \
        -n "$n" --seed "$tape_seed" ${plan[@]+"${plan[@]}"} || exit 2
    if ! "$CC" -std=c99 -O2 -ffp-contract=off -Wall -Wextra ${no_v[@]+"${no_v[@]}"} \
            -I "$work" -o "$work/driver" "$here/swarm_driver.c" -lm 2> "$work/cc.log"; then
        die 1 "$tape: $CC rejected the emitted code: $(first_line "$work/cc.log")"
    fi
    "$work/driver" "$work/driver.txt" > "$work/c.txt" || die 1 "$tape: the driver failed to run"
    "$GRADTOOL" backward "$tape" --data "$work/data.npz" --json --hex > "$work/ref.json" || exit 2
    "$PYTHON" "$here/emitc_harness.py" swarm-compare "$tape" "$work/c.txt" "$work/ref.json" \
        ${plan[@]+"${plan[@]}"} || exit $?
    if [ "$use_nvcc" -eq 1 ]; then
        nvcc_check "$tape" "$cu"
        nvcc_check "$tape" "$here/swarm_driver.c" -I "$work" ${no_v[@]+"${no_v[@]}"}
    fi
    echo "emitc_oracle: $tape: swarm grad() summed over $n examples, bit-identical to the" \
         "tape (${plan[*]-every param, no bindings}; $how)"
}

how="gcc"
[ "$use_nvcc" -eq 0 ] || how="gcc, nvcc -c ok"
checked=0
for tape in "${tapes[@]}"; do
    [ -f "$tape" ] && [ -r "$tape" ] || die 2 "$tape: no such readable file"
    if [ "$swarm" -eq 1 ]; then
        check_swarm_abi "$tape" $((seed + checked))
    else
        check_gradtool_abi "$tape"
    fi
    checked=$((checked + 1))
done
[ "$use_nvcc" -eq 1 ] || echo "emitc_oracle: nvcc not on PATH; CUDA compile step skipped"
echo "emitc_oracle: $checked tape(s) OK"
