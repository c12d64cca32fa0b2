#!/bin/sh
# The CPU learning comparison of issue #49 item 3 on a locally built hopper-medium-replay: the
# quick preset, 4 seeds, MOMBO elite_spread and lcb at --moments=diagonal and lowrank, one set of
# dynamics shared by the four. Run from the repository root; R and the Minari root are scratch.
R=${R:-/work/data/mr/learning}
export MINARI_DATASETS_PATH=${MINARI_DATASETS_PATH:-/work/data/mr}
mkdir -p $R
# The dataset: the online SAC run up to its medium point, its replay buffer (docs/datasets.md).
[ -d $MINARI_DATASETS_PATH/mombo/hopper/medium-replay-v0 ] || \
  python3 -m experiments.collect --env=hopper-medium-replay --workdir=$R/collect > $R/collect.log 2>&1
python3 -m experiments.train_dynamics --env=hopper-medium-replay --preset=quick --seeds=4 \
  --workdir=$R/dynamics > $R/dynamics.log 2>&1
run() {  # target moments name
  python3 -m experiments.run --env=hopper-medium-replay --preset=quick --seeds=4 --target=$1 \
    --moments=$2 --workdir=$R/hopper-medium-replay/$3/s0x4 --dynamics_dir=$R/dynamics > $R/$3.log 2>&1
}
# Two chains side by side on the 2 cores, each a diagonal run then a lowrank one.
(run elite_spread diagonal mombo-elite_spread; run elite_spread lowrank mombo-elite_spread-lowrank) &
(run lcb diagonal mombo-lcb; run lcb lowrank mombo-lcb-lowrank) &
wait
for n in mombo-elite_spread mombo-elite_spread-lowrank mombo-lcb mombo-lcb-lowrank; do
  d=$R/hopper-medium-replay/$n/s0x4
  cp $d/metrics.csv benchmarks/learning/hopper-medium-replay-lowrank-cpu/metrics_$n.csv
  cp $d/summary.json benchmarks/learning/hopper-medium-replay-lowrank-cpu/summary_$n.json
  cp $d/config.json benchmarks/learning/hopper-medium-replay-lowrank-cpu/config_$n.json
  cp $R/$n.log benchmarks/learning/hopper-medium-replay-lowrank-cpu/$n.log
done
cp $R/dynamics.log benchmarks/learning/hopper-medium-replay-lowrank-cpu/
python3 -m benchmarks.learning.lowrank_compare --dir=benchmarks/learning/hopper-medium-replay-lowrank-cpu \
  > benchmarks/learning/hopper-medium-replay-lowrank-cpu/compare.txt
