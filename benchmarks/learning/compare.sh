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
# Everything else is each algorithm's reference configuration for the dataset (config.TASKS),
# except the budget: EPOCHS x 1000 gradient steps on the paper's 3000-epoch actor schedule (a
# prefix of the paper's run), evaluation every EVAL_EVERY epochs on 10 episodes.
# ALGOS lists runs as <algo>[:<mombo target>[@<beta>]]: `mombo` is the released code's
# elite_spread at the paper's beta; `mombo:lcb@1.0` the paper's written equation at beta 1.0
# (LCB_BETA, its beta matched to elite_spread's penalty scale: see README.md here).
set -euo pipefail
DATASET=${DATASET:-hopper-medium-replay}
EPOCHS=${EPOCHS:-100}
SEEDS=${SEEDS:-3}
EVAL_EVERY=${EVAL_EVERY:-5}
ROOT=${ROOT:-runs/compare}
PARALLEL=${PARALLEL:-0}
LCB_BETA=${LCB_BETA:-}
ALGOS=${ALGOS:-"mombo mobile mopo${LCB_BETA:+ mombo:lcb@$LCB_BETA}"}
DYN_MAX_EPOCHS=${DYN_MAX_EPOCHS:-}
PRESET=${PRESET:-paper}        # tiny: a smoke test of this script
PY=${PY:-python3}
# Extra flags of experiments.uncertainty, e.g. a CPU budget: "--draws=20 --num_policy=200 --episodes=2"
UNCERTAINTY_FLAGS=${UNCERTAINTY_FLAGS:-}
export PYTHONUNBUFFERED=1

dyn=$ROOT/$DATASET/dynamics
stamp() { echo "[$(date +%H:%M:%S)] $*"; }

stamp "dynamics: $SEEDS ensemble(s) -> $dyn"
# Saved ensembles are named by their training settings (seed0x<S>-<tag>): train once here; a run
# whose algorithm's dynamics settings differ trains its own beside it (docs/protocol.md).
if ! compgen -G "$dyn/seed0x$SEEDS-*" > /dev/null; then
  $PY -m experiments.train_dynamics --env="$DATASET" --seeds="$SEEDS" --workdir="$dyn" \
      --preset="$PRESET" ${DYN_MAX_EPOCHS:+--max_epochs=$DYN_MAX_EPOCHS}
fi

if [ "$PARALLEL" = 1 ]; then
  # Several processes on one accelerator: none may take most of its memory up front.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
fi
pids=()
for spec in $ALGOS; do
  algo=${spec%%:*}
  extra=()
  label=$algo
  if [ "$algo" = mombo ]; then
    target=elite_spread
    case $spec in *:*) target=${spec#*:}; target=${target%%@*} ;; esac
    extra+=(--target="$target")
    label=mombo-$target
  fi
  case $spec in *@*) extra+=(--beta="${spec#*@}"); label=$label-beta${spec#*@} ;; esac
  wd=$ROOT/$DATASET/$label/s0x$SEEDS
  mkdir -p "$wd"
  cmd=($PY -m experiments.run --env="$DATASET" --algo="$algo" --seeds="$SEEDS" --epochs="$EPOCHS" --preset="$PRESET"
       --eval_every="$EVAL_EVERY" --workdir="$wd" --dynamics_dir="$dyn"
       ${DYN_MAX_EPOCHS:+--dynamics_max_epochs=$DYN_MAX_EPOCHS} "${extra[@]}")
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
for states in policy dataset; do
  $PY -m experiments.uncertainty --runs="$ROOT/$DATASET" --states="$states" --out="$ROOT/$DATASET" \
      $UNCERTAINTY_FLAGS
done
$PY -m experiments.mm_vs_mc --run="$ROOT/$DATASET/mombo-elite_spread/s0x$SEEDS" --out="$ROOT/$DATASET"
stamp "done: $ROOT/report.md, $ROOT/$DATASET/uncertainty*.md, $ROOT/$DATASET/mm_vs_mc.png"
exit $status
