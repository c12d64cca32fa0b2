r"""The paper's uncertainty-quantifier experiment (Table 2; appendix "Uncertainty quantifier
experiment" of mombo-neurips2024; docs/protocol.md, "Table 2 (uncertainty quantifiers): the
reading"): how often, and how tightly, each algorithm's own penalty U(s, a) bounds the error of a
single-sample Bellman backup.

  python -m experiments.uncertainty --runs=runs/hopper-medium          # every run under it
  python -m experiments.uncertainty --runs=runs/a/s0x4,runs/b/s0x4 --states=dataset --out=report/

Definition. For every run (a folder with config.json and checkpoints/, written by experiments.run),
every seed and every selected tuple (s, a, r, s'_real, d) of the real environment:
  B Q(s, a)       = r + gamma (1-d) E_{a' ~ pi(s'_real)}[min_j Q'_j(s'_real, a')]
                    (the exact operator: MuJoCo's dynamics are deterministic; the expectation over
                    --num_policy policy samples, "we estimate the exact Bellman target by taking
                    samples from the policies"),
  B^ Q(s, a, s^') = r^ + gamma (1-d^) min_j Q'_j(s^', a^')
                    from ONE draw (s^', r^) of the run's learned model (a uniformly random elite per
                    row, as in rollouts), a^' ~ pi(s^') one sample, d^ the termination function
                    (or a runaway state, as in rollouts),
  accuracy        = 1(U >= |B Q - B^ Q|),      tightness = U - |B Q - B^ Q|,
each averaged over --draws model draws per tuple, then over the tuples, then (uncertainty.md) mean
+- std over seeds. Both backups are deterministic (no entropy term), for every algorithm. Q' are
the run's target critics, pi its policy. Averaging B^ Q over draws would remove the single-sample
error U is meant to cover, so only B Q is an expectation.

U is exactly the per-row penalty the run's training subtracts (mombo_jax.core.targets.get_penalty,
the functions the targets themselves call), redrawn with every model draw:
  MOMBO lcb           beta sqrt(var_r + gamma^2 (1-d^) v*) of the Gaussian of the elite that drew
                      s^' (what a rollout row stores), v* the MM variance of the target critic with
                      the smaller MM mean;
  MOMBO elite_spread  beta std_e T_e over the elites (ddof=1); mixture beta sqrt(mean_e MM var_e +
                      var_e T_e) (the run's config.target decides which);
  MOBILE              beta std over elites of the mean over N next-state samples of min_j Q';
  MOPO                lambda max over all members ||sigma||_2 (subtracted from the model reward).
It is reported as training subtracts it (accuracy, tightness, penalty_mean) and unscaled, U / beta
(accuracy_unscaled, tightness_unscaled, penalty_unscaled_mean), since the paper's definitions of U
carry no coefficient.

The paper leaves two points open; the reading above (the model's reward in B^ Q, each algorithm's
U as its training subtracts it: MOMBO's released code's elite spread for the paper's MOMBO) is
the one chosen, and both alternatives are measured on the same draws, in their own columns:
  real_reward  B^ Q = r + gamma (1-d^) min_j Q'_j(s^', a^') with the tuple's REAL reward r (the
               same s^', a^', d^), against the algorithm's own U: accuracy_real_reward,
               tightness_real_reward, their _unscaled_ twins, bellman_error_real_reward_mean;
  eq1          (MOMBO runs; NaN for the others) U = sqrt(var_r^ + gamma^2 (1-d^) v*), eq. (1)'s
               gamma sigma_MM of the target critic with the smaller MM mean at the drawing
               elite's next-state Gaussian, plus that elite's reward variance as MOMBO lcb's
               target writes it (for a lcb run, its own U), against the model-reward B^ Q:
               accuracy_eq1, tightness_eq1 (times the run's beta), accuracy_unscaled_eq1,
               tightness_unscaled_eq1, penalty_eq1_mean, penalty_unscaled_eq1_mean.

States (--states):
  policy   the paper's: each seed's own --episodes evaluation episodes of its deterministic policy
           in the real environment (the run's evaluation env: an imported D4RL walker dataset's is
           D4RL's walker model, mombo_jax.env.envs.eval_env_spec), every --every-th transition and
           the last of each;
  dataset  the same --num_states transitions of the dataset the run trained on for every algorithm
           and seed (drawn with --seed), so no policy-quality confound.

Writes (into --out, default the first --runs folder) uncertainty.csv and uncertainty.md for
--states=policy, uncertainty_dataset.csv / .md for --states=dataset: one CSV row per run and seed
(columns run, env, dataset, algo, target, states, seed, epoch, beta, transitions, draws,
num_policy, accuracy, tightness, accuracy_unscaled, tightness_unscaled, penalty_mean,
penalty_unscaled_mean, bellman_error_mean, below, then the alternatives' columns above); the
markdown gives mean +- std over seeds per dataset and algorithm (the paper's bold / underline rule;
a run below the paper's setup, `below`, marked § and never bold beside the paper's columns, as in
report.md), the
paper's own Table 2 numbers in their own columns beside the as-trained accuracy and tightness of
the chosen reading and of each alternative (a note says what they compare with), and the mean U
and Bellman error.

A run whose dataset was rebuilt or replaced since it trained (config.json records the identity of
its data) is refused in one line naming the change, as training refuses to resume it; with
--states=policy a dataset that is not local is not needed.

The experiment's runs and outputs are mombo_jax.analysis.uncertainty_runs's, the per-tuple backups
and scores mombo_jax.analysis.quantifier_quality's; this program only parses the flags.
"""
import os

from absl import flags, logging

from experiments import _cli
from mombo_jax.analysis import uncertainty_runs
from mombo_jax.core import algorithms

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_list("runs", None, "Run workdirs, or folders searched for them.")
  flags.DEFINE_enum("states", "policy", uncertainty_runs.STATES,
                    "Tuples: 'policy' (the paper's: each seed's evaluation episodes in the real "
                    "env, every --every-th step and the last) or 'dataset' (--num_states "
                    "transitions of the run's dataset, the same for every algorithm and seed).")
  flags.DEFINE_integer("episodes", 10, "--states=policy: real-env episodes per seed.")
  flags.DEFINE_integer("every", 10, "--states=policy: keep every n-th transition of an episode "
                       "(and the last).")
  flags.DEFINE_integer("max_episode_steps", None, "--states=policy: time-limit override "
                       "(default: the env's).")
  flags.DEFINE_integer("num_states", 1000, "--states=dataset: transitions drawn (with --seed) "
                       "from the run's dataset.")
  flags.DEFINE_integer("draws", 100, "Model draws (s^', r^) per tuple, each one single-sample "
                       "B^ Q and one U; accuracy and tightness are averaged over them.")
  flags.DEFINE_integer("num_policy", 1000, "Policy samples a' ~ pi(s'_real) in the exact "
                       "Bellman target B Q (the paper: 1000).")
  flags.DEFINE_integer("chunk", 256, "Tuples per jitted call (memory: num_policy x chunk critic "
                       "rows); lower it if memory is short.")
  flags.DEFINE_integer("seed", 0, "PRNG seed: env resets (seed + seed index), model and policy "
                       "draws, and the --states=dataset selection.")
  flags.DEFINE_list("moments", None, "MOMBO runs: score U at each of these moment modes (diagonal, "
                    "lowrank, lowrank<k>, full; docs/moment_matching.md) on the same tuples and "
                    "draws, one column each ('MOMBO (<target>, moments=<mode>)'); default: each "
                    "run at its own (config.json's `moments`).")
  flags.DEFINE_string("out", None, "Output folder (default: the first --runs folder).")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.runs:
    raise _cli.UsageError("--runs is required (run workdirs or folders holding them).")
  for name in ("episodes", "every", "num_states", "draws", "num_policy", "chunk"):
    if getattr(FLAGS, name) < 1:
      raise _cli.UsageError(f"--{name} must be >= 1, got {getattr(FLAGS, name)}.")
  for mode in FLAGS.moments or ():
    try:
      algorithms.parse_moments(mode)
    except ValueError as e:
      raise _cli.UsageError(f"--moments: {e}") from None
  run_dirs = uncertainty_runs.find_run_dirs(FLAGS.runs)
  rows = uncertainty_runs.evaluate_runs(
      run_dirs, uncertainty_runs.TupleSource(
          states=FLAGS.states, episodes=FLAGS.episodes, every=FLAGS.every,
          max_episode_steps=FLAGS.max_episode_steps, num_states=FLAGS.num_states),
      uncertainty_runs.Scoring(draws=FLAGS.draws, num_policy=FLAGS.num_policy, chunk=FLAGS.chunk,
                               moments=tuple(FLAGS.moments) if FLAGS.moments else None),
      FLAGS.seed)
  csv_path, md_path = uncertainty_runs.write_outputs(rows, FLAGS.out or FLAGS.runs[0], FLAGS.states)
  print(f"wrote {csv_path} and {os.path.basename(md_path)}")


if __name__ == "__main__":
  _cli.run(main, define_flags, flag_names={"dirs": "runs"})
