#!/usr/bin/env bash
# The three algorithms side by side on one dataset at one budget (issue #9 item 6), then the
# paper's other evidence on those very runs: the report (final score, AULC, curves), the
# uncertainty-quantifier table (accuracy, tightness) and the moment-matching vs Monte Carlo figure.
#
#   DATASET=hopper-medium-replay EPOCHS=100 SEEDS=3 ROOT=runs/compare \
#       bash benchmarks/learning/compare.sh
#
# The dataset must exist under MINARI_DATASETS_PATH (build it first, e.g.
#   python3 -m experiments.collect --env=hopper-medium-replay --sac_steps=400000).
# One set of dynamics ensembles (one per seed) is trained first and shared by the three algorithms,
# so they differ only in their targets. PARALLEL=1 launches the three algorithms at once (one GPU
# runs them side by side; on a 2-core CPU leave PARALLEL=0). Each launch resumes from its
# checkpoints when the script runs again; finished runs are skipped by experiments.run itself.
# Everything else is the paper's configuration for the dataset (config.make_config), except the
# budget: EPOCHS x 1000 gradient steps, evaluation every EVAL_EVERY epochs on 10 episodes.
set -euo pipefail
DATASET=${DATASET:-hopper-medium-replay}
EPOCHS=${EPOCHS:-100}
SEEDS=${SEEDS:-3}
EVAL_EVERY=${EVAL_EVERY:-5}
ROOT=${ROOT:-runs/compare}
PARALLEL=${PARALLEL:-0}
ALGOS=${ALGOS:-"mombo mobile mopo"}
DYN_MAX_EPOCHS=${DYN_MAX_EPOCHS:-}
PRESET=${PRESET:-paper}        # tiny: a smoke test of this script
PY=${PY:-python3}
export PYTHONUNBUFFERED=1

dyn=$ROOT/$DATASET/dynamics
stamp() { echo "[$(date +%H:%M:%S)] $*"; }

stamp "dynamics: $SEEDS ensemble(s) -> $dyn"
if [ ! -d "$dyn/seed0x$SEEDS" ]; then
  $PY -m experiments.train_dynamics --env="$DATASET" --seeds="$SEEDS" --workdir="$dyn" \
      --preset="$PRESET" ${DYN_MAX_EPOCHS:+--max_epochs=$DYN_MAX_EPOCHS}
fi

if [ "$PARALLEL" = 1 ]; then
  # Several processes on one accelerator: none may take most of its memory up front.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
fi
pids=()
for algo in $ALGOS; do
  wd=$ROOT/$DATASET/$algo/s0x$SEEDS
  mkdir -p "$wd"
  cmd=($PY -m experiments.run --env="$DATASET" --algo="$algo" --seeds="$SEEDS" --epochs="$EPOCHS" --preset="$PRESET"
       --eval_every="$EVAL_EVERY" --workdir="$wd" --dynamics_dir="$dyn")
  stamp "${cmd[*]}"
  if [ "$PARALLEL" = 1 ]; then
    "${cmd[@]}" > "$wd/launch.log" 2>&1 &
    pids+=($!)
  else
    "${cmd[@]}" 2>&1 | tee "$wd/launch.log"
  fi
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
stamp "runs finished (status $status)"

$PY -m experiments.report "$ROOT"
$PY -m experiments.uncertainty --runs="$ROOT" --out="$ROOT"
$PY -m experiments.mm_vs_mc --run="$ROOT/$DATASET/mombo/s0x$SEEDS" --out="$ROOT"
stamp "done: $ROOT/report.md, $ROOT/uncertainty.md, $ROOT/mm_vs_mc.png"
exit $status
