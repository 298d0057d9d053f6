#!/usr/bin/env bash
# bench_compare.sh REV_BEFORE [REV_AFTER] -- run the benchmark scripts of two revisions
# side by side, in one run, on this machine: before, after, before, after (so both see
# the same load), each from a temporary worktree of its revision.
#
#   bash scripts/bench_compare.sh db55903          # that revision vs the working tree
#   BENCHES="bench_train bench_replay" bash scripts/bench_compare.sh A B
#   SCRIPTS=after bash scripts/bench_compare.sh A B  # both sides timed by B's scripts
#
# Prints each script's output under a header naming the revision and round.  The scripts
# are the revisions' own (a later script may not exist in an earlier tree: skipped there),
# or with SCRIPTS=after the after side's scripts/ for both: the same method of timing on
# both sides, the before side's package, samples and kernels (copied into its temporary
# worktree; a script that needs what the earlier tree lacks fails there, and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
before="${1:?usage: bench_compare.sh REV_BEFORE [REV_AFTER]}"
after="${2:-}"
benches="${BENCHES:-bench_train bench_replay bench_emitc bench_fdlibm}"
rounds="${ROUNDS:-2}"
tmp="$(mktemp -d)"
cleanup() {
    git worktree remove --force "$tmp/before" >/dev/null 2>&1 || true
    [ -n "$after" ] && git worktree remove --force "$tmp/after" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
git worktree add -q --detach "$tmp/before" "$before"
if [ -n "$after" ]; then
    git worktree add -q --detach "$tmp/after" "$after"
    after_dir="$tmp/after"
else
    after_dir="$PWD"
fi
case "${SCRIPTS:-own}" in
    own) ;;
    after) cp -R "$after_dir/scripts/." "$tmp/before/scripts/" ;;
    *) echo "bench_compare.sh: SCRIPTS must be 'own' or 'after', not '$SCRIPTS'" >&2; exit 2 ;;
esac
for round in $(seq 1 "$rounds"); do
    for bench in $benches; do
        for side in before after; do
            dir="$tmp/before"; rev="$before"
            [ "$side" = after ] && { dir="$after_dir"; rev="${after:-working tree}"; }
            [ -f "$dir/scripts/$bench.py" ] || { echo "== $bench ($side $rev): not in that tree"; continue; }
            echo "== $bench, $side ($rev), round $round${SCRIPTS:+, scripts: ${SCRIPTS}}"
            (cd "$dir" && PYTHONPATH="$dir" python "scripts/$bench.py" ${BENCH_ARGS:-})
        done
    done
done
