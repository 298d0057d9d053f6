#!/usr/bin/env bash
# bench_compare.sh REV_BEFORE [REV_AFTER] -- run the benchmark scripts of two revisions
# side by side, in one run, on this machine: before, after, before, after (so both see
# the same load), each from a temporary worktree of its revision.
#
#   bash scripts/bench_compare.sh db55903          # that revision vs the working tree
#   BENCHES="bench_train bench_replay" bash scripts/bench_compare.sh A B
#
# Prints each script's output under a header naming the revision and round.  The scripts
# are the revisions' own (a later script may not exist in an earlier tree: skipped there).
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
for round in $(seq 1 "$rounds"); do
    for bench in $benches; do
        for side in before after; do
            dir="$tmp/before"; rev="$before"
            [ "$side" = after ] && { dir="$after_dir"; rev="${after:-working tree}"; }
            [ -f "$dir/scripts/$bench.py" ] || { echo "== $bench ($side $rev): not in that tree"; continue; }
            echo "== $bench, $side ($rev), round $round"
            (cd "$dir" && PYTHONPATH="$dir" python "scripts/$bench.py" ${BENCH_ARGS:-})
        done
    done
done
