#!/usr/bin/env bash
# The loop's host overhead before and after: benchmarks/bench_loop.py (NEW_TREE's copy) run in
# OLD_TREE, then in NEW_TREE, back to back; both outputs go to OUT, one after the other.
#
#   benchmarks/compare_loop.sh OLD_TREE NEW_TREE OUT [bench_loop flags, e.g. --steps=5,50]
#
# Each run imports its own tree's mombo_jax (run from that tree's root; the header names the file
# imported and the tree's git version). NEW_TREE's script is copied into OLD_TREE for the run; an
# OLD_TREE copy that differs is put back afterwards. Each run gets its own scratch folder (workdirs,
# dynamics, compilation cache), removed at the end; the dataset (~/.minari) is shared and built
# once if missing. ~10-15 minutes on 2 cores.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 OLD_TREE NEW_TREE OUT [bench_loop flags]" >&2
  exit 2
fi
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
out=$3
shift 3
script="$new/benchmarks/bench_loop.py"
[ -f "$script" ] || { echo "$script not found" >&2; exit 2; }
for tree in "$old" "$new"; do
  [ -d "$tree/mombo_jax" ] || { echo "$tree has no mombo_jax/" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/compare_loop.XXXXXX")
target="$old/benchmarks/bench_loop.py"
restore() {
  if [ -f "$work/old_bench_loop.py" ]; then
    cp "$work/old_bench_loop.py" "$target"
  elif [ -f "$work/copied" ]; then
    rm -f "$target"
  fi
  rm -rf "$work"
}
trap restore EXIT
if [ "$old" != "$new" ]; then
  if [ -f "$target" ]; then
    cmp -s "$script" "$target" || cp "$target" "$work/old_bench_loop.py"
  else
    touch "$work/copied"
  fi
  cp "$script" "$target"
fi

for side in old new; do
  tree=${!side}
  echo "== $side: $tree" >&2
  (cd "$tree" && python3 -m benchmarks.bench_loop --out="$work/$side.txt" \
      --scratch="$work/scratch_$side" "$@")
  rm -rf "$work/scratch_$side"
done

{
  echo "# compare_loop.sh: benchmarks/bench_loop.py (from $new) run in OLD_TREE then NEW_TREE"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); flags: ${*:-(defaults)}"
  echo
  echo "######## BEFORE (OLD_TREE $old)"
  cat "$work/old.txt"
  echo
  echo "######## AFTER (NEW_TREE $new)"
  cat "$work/new.txt"
} > "$out"
echo "wrote $out" >&2
