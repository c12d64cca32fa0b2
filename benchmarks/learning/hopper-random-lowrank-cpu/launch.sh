#!/bin/sh
# The CPU learning comparison (issue #49 item 3): hopper-random, --preset=quick, 4 seeds,
# diagonal vs lowrank for elite_spread and lcb, dynamics shared. Run from a snapshot of the tree.
R=/work/data/lowrank/learning
export MINARI_DATASETS_PATH=/work/data/lowrank PYTHONPATH=$PWD
python3 -m experiments.train_dynamics --env=hopper-random --preset=quick --seeds=4 --workdir=$R/dynamics > $R/dynamics.log 2>&1
run() {  # target moments name
  nice python3 -m experiments.run --env=hopper-random --preset=quick --seeds=4 --target=$1 \
    --moments=$2 --workdir=$R/hopper-random/$3/s0x4 --dynamics_dir=$R/dynamics > $R/$3.log 2>&1
}
(run elite_spread diagonal mombo-elite_spread; run lcb diagonal mombo-lcb) &
(run elite_spread lowrank mombo-elite_spread-lowrank; run lcb lowrank mombo-lcb-lowrank) &
wait
# 10:28 UTC: the machine under load ~28 (shared), the chains were cut: the two lcb runs were
# started at once beside the elite_spread ones (same command as run() above), all four in parallel.
