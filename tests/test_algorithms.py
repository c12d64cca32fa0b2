"""Algorithms as values (mombo_jax.core.algorithms) and the epoch's settings
(epoch_settings.EpochSettings).

A toy algorithm registered from outside the package is configured from its record, its compiled
epoch built from its EpochSettings alone (so the epoch reads nothing else of the Config);
docs/architecture.md's "Add an algorithm" runs as printed, from a module outside the package,
through training, load_policy, export and the analyses; --algo lists the registry; online SAC's
settings are plain SAC's, with no faked dataset name."""
import dataclasses
import json
import os

import numpy as np
import pytest

from mombo_jax.core import algorithms, targets
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.records.workdir import run_dir
from mombo_jax.settings import config as config_lib
from tests.conftest import HANG_S


# --- a toy algorithm, as a user writes it (docs/architecture.md, "Add an algorithm") -----------
def bonus_target(agent, batch, key, *, dyn, config, term_fn, beta=None, real_rows=None,
                 auto_alpha=None):
  """Plain SAC's target plus a constant bonus of 0.1 per row."""
  y, aux = targets.plain(agent, batch, key, dyn=dyn, config=config, term_fn=term_fn,
                         auto_alpha=auto_alpha)
  return y + 0.1, aux


TOY = algorithms.register(algorithms.Algorithm("toy_bonus", bonus_target, references="mopo"))
# ------------------------------------------------------------------------------------------------

TINY = dict(epochs=1, steps_per_epoch=3, rollout_batch_size=16, eval_every=1, eval_episodes=1,
            dyn_max_epochs=1, actor_hidden=(8, 8), critic_hidden=(8, 8), dyn_hidden=(8, 8),
            dyn_weight_decay=(2.5e-5, 5e-5, 1e-4))


def test_registry_gives_records_and_refuses_unknown_names():
  assert config_lib.make_config("hopper-random", "mombo", target="lcb").algorithm is \
      algorithms.MOMBO_LCB
  assert algorithms.get("mopo").penalise_reward
  assert algorithms.get("mombo", "mixture").min_elites == 2
  with pytest.raises(ValueError, match="Unknown algo 'nope'; choose one of mombo, mobile, mopo"):
    algorithms.get("nope")
  with pytest.raises(ValueError, match="Unknown target 'x' for mombo"):
    algorithms.get("mombo", "x")
  with pytest.raises(ValueError, match="registered already"):
    algorithms.register(dataclasses.replace(TOY, coefficient="lambda"))
  assert algorithms.register(TOY) is TOY                      # the same record again: no-op
  with pytest.raises(ValueError, match="Unknown algo 'sac'"):  # online SAC's record: not offline
    config_lib.make_config("hopper-random", "sac")


def test_one_way_to_a_records_functions():
  """targets.get_target / get_penalty / bind give every built-in record's functions themselves
  (its stand-ins resolved, by name); stand-ins compare by name; a reward penalty needs a
  penalty."""
  builtins = [algorithms.MOMBO_LCB, algorithms.MOMBO_ELITE_SPREAD, algorithms.MOMBO_MIXTURE,
              algorithms.MOBILE, algorithms.MOPO]
  for record in builtins:
    config = config_lib.make_config("hopper-random", record.name,
                                    **({"target": record.variant} if record.variant else {}))
    assert config.algorithm is record
    assert targets.get_target(config) is getattr(targets, record.bellman_target.name)
    assert targets.get_penalty(config) is getattr(targets, record.penalty.name)
    assert targets.bind(config, None, None).func is targets.get_target(config)
  assert targets.get_penalty(config_lib.make_config("hopper-random", "mopo")) is \
      targets.penalty_mopo
  assert algorithms.MOPO.penalty == algorithms._Target("penalty_mopo")
  assert algorithms.MOPO.penalty != algorithms._Target("penalty_mobile")
  toy = config_lib.make_config("hopper-random", "toy_bonus")
  assert targets.get_target(toy) is bonus_target
  with pytest.raises(ValueError, match="toy_bonus has no uncertainty penalty"):
    targets.get_penalty(toy)
  with pytest.raises(ValueError, match="penalise_reward needs a penalty"):
    algorithms.Algorithm("toy_no_penalty", bonus_target, penalise_reward=True)


def test_the_old_spelling_penalize_reward_still_works_with_a_warning():
  """penalise_reward is the one spelling; a record written with the old keyword (or code reading
  the old attribute) still works, warned, and equals the record of the new spelling."""
  with pytest.warns(DeprecationWarning, match="spelled penalise_reward"):
    old = algorithms.Algorithm("toy_old", bonus_target, targets.penalty_mopo,
                               penalize_reward=True)
  new = algorithms.Algorithm("toy_old", bonus_target, targets.penalty_mopo, penalise_reward=True)
  assert old == new and hash(old) == hash(new) and old.penalise_reward
  with pytest.warns(DeprecationWarning, match="spelled penalise_reward"):
    assert algorithms.MOPO.penalize_reward is True
  assert not dataclasses.replace(old, penalise_reward=False).penalise_reward
  with pytest.raises(ValueError, match="penalise_reward needs a penalty"), \
      pytest.warns(DeprecationWarning):
    algorithms.Algorithm("toy_no_penalty", bonus_target, penalize_reward=True)


def test_one_label_builder():
  assert [algorithms.label("mombo", "lcb", f) for f in ("name", "title", "column")] == \
      ["mombo-lcb", "mombo (lcb)", "MOMBO (lcb)"]
  assert algorithms.label("mobile", "elite_spread", "column") == "MOBILE"
  assert algorithms.label("mombo", None, "column") == "MOMBO (target?)"
  assert algorithms.label("unregistered", "lcb") == "unregistered"      # a foreign run's record
  assert TOY.label == "toy_bonus"


def test_epoch_settings_hold_what_the_epoch_computes_with():
  """Configs that differ only in what the compiled epoch never reads (seeds, evaluation, the
  dataset of one env, the reference source, the dynamics' training) give one EpochSettings;
  a setting the epoch reads, or the algorithm, gives another; the cells' own settings are None."""
  a = config_lib.make_config("hopper-random", "mobile", "tiny")
  same = config_lib.make_config("hopper-medium", "mobile", "tiny", reference="authors",
                                beta=a.beta, seed=3, num_seeds=2, eval_every=7, dyn_lr=1e-2,
                                dyn_max_epochs=9, real_ratio=a.rollout.real_ratio,
                                rollout_length=a.rollout.rollout_length,
                                auto_alpha=a.agent.auto_alpha,
                                alpha=a.agent.alpha)
  assert epoch_settings(a) == epoch_settings(same)
  assert not hasattr(epoch_settings(a), "env")          # no faked dataset name
  for change in (dict(gamma=0.9), dict(actor_lr=1e-3), dict(algo="mopo")):
    assert epoch_settings(a) != epoch_settings(
        a.replace(**change))
  cells = epoch_settings(a, ("rollout_length", "real_ratio"))
  assert (cells.beta, cells.rollout.real_ratio, cells.rollout.rollout_length) == (
      None, None, a.rollout.rollout_length)


def test_a_registered_toy_algorithm_is_configured_from_its_record(hopper_random_2000, tmp_path):
  """The toy algorithm, registered above from outside the package: make_config takes its name and
  its reference tables, its compiled epoch is built from its EpochSettings alone
  (cells_program.make_cells_chunk), its label names the workdir. (It trains end to end, through the
  command line and every reader, in test_the_docs_example_runs_as_printed_outside_the_package.)"""
  config = config_lib.make_config(hopper_random_2000, "toy_bonus", preset="tiny", **TINY)
  assert config.reference == "offlinerl_kit"           # MOPO's tables, as it asked
  assert epoch_settings(config).algorithm is TOY
  workdir = run_dir(str(tmp_path), hopper_random_2000, "toy_bonus", config.target, config.seed,
                    config.num_seeds)
  assert os.path.join(hopper_random_2000, TOY.label, "s0x1") in workdir
  assert algorithms.module_of("toy_bonus") == __name__      # what its runs record


def test_an_algorithm_without_variants_has_no_target(tmp_path):
  """config.json said `target: elite_spread` (the --target flag's default) for an algorithm
  without variants; it says null, the Config's target is None whatever it was given, and a
  config.json written before still matches its run."""
  from mombo_jax.records.workdir import Workdir, config_from_record, config_record
  for algo in ("toy_bonus", "mopo", "mobile"):
    config = config_lib.make_config("hopper-random", algo, preset="tiny", target="elite_spread")
    assert config.target is None and config.replace(target="lcb").target is None
    record = config_record(config, "hopper-random")
    assert record["target"] is None
    wd = Workdir(str(tmp_path / algo))
    os.makedirs(wd.path)
    with open(wd.file("config.json"), "w") as f:           # as the version before wrote it
      json.dump(dict(record, target="elite_spread"), f)
    assert wd.check_config(config, "hopper-random")[0]["target"] is None   # not refused
    assert config_from_record(dict(record, target="elite_spread"))[0] == config
  mombo = config_lib.make_config("hopper-random", "mombo", preset="tiny", target="lcb")
  assert mombo.target == "lcb" and config_record(mombo, "hopper-random")["target"] == "lcb"
  # A plain algorithm's config made MOMBO's again takes MOMBO's default target.
  mopo = config_lib.make_config("hopper-random", "mopo", preset="tiny")
  assert mopo.replace(algo="mombo", reference=None).target == config_lib.Config.target
  assert config_lib.Config.target == "elite_spread"


def test_online_sac_is_plain_sac_with_its_own_env():
  from mombo_jax.collection import online_sac
  settings = online_sac.online_config("hopper", (16, 16), 32)
  assert settings.algorithm is algorithms.SAC and algorithms.SAC.penalty is None
  assert settings.env_name == "hopper" and not hasattr(settings, "env")


# --- docs/architecture.md's "Add an algorithm", run exactly as printed --------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _docs_example():
  """(the module's source, [command lines]) of the section's python and bash blocks."""
  import re
  with open(os.path.join(REPO, "docs", "architecture.md")) as f:
    text = f.read()
  section = text[text.index("## Add an algorithm"):]
  module = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
  return module, commands


def test_a_registered_algorithm_shows_up_in_the_algo_flag():
  """--algo's choices are the registry's: TOY (registered above) is in its help and parses;
  MODULE:NAME imports the module; a bad value names the registered ones."""
  from absl import flags

  from experiments import _cli
  _cli.define_algo("algo_probe", "mombo", "Probe.")
  try:
    assert "toy_bonus" in flags.FLAGS["algo_probe"].help
    flags.FLAGS["algo_probe"].parse("toy_bonus")
    assert flags.FLAGS.algo_probe == "toy_bonus"
    flags.FLAGS["algo_probe"].parse("tests.test_algorithms:toy_bonus")
    assert flags.FLAGS.algo_probe == "toy_bonus"
    with pytest.raises(flags.IllegalFlagValueError, match="toy_bonus"):
      flags.FLAGS["algo_probe"].parse("nope")
    with pytest.raises(flags.IllegalFlagValueError, match="cannot import module 'no_such_mod'"):
      flags.FLAGS["algo_probe"].parse("no_such_mod:toy_bonus")
  finally:
    delattr(flags.FLAGS, "algo_probe")


@pytest.mark.slow
def test_the_docs_example_runs_as_printed_outside_the_package(hopper_random_2000, tmp_path):
  """The section's module, written to a folder outside the package, and its commands run there as
  printed: it trains from the command line (--algo=MODULE:NAME), and load_policy, export,
  uncertainty, mm_vs_mc and the report each read its run in a fresh process that imports the
  recorded module again. Where the module is not on the path, a reader refuses in one line naming
  it."""
  import subprocess
  import sys

  from mombo_jax.errors import UserError
  from mombo_jax.records.workdir import Workdir, config_from_record
  module, commands = _docs_example()
  (tmp_path / "my_algorithms.py").write_text(module)
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  for command in commands:
    assert command.startswith("python3 "), command
    proc = subprocess.run(command.replace("python3", sys.executable, 1), shell=True,
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, (command, proc.stderr[-3000:])
  run = tmp_path / "runs" / "hopper-random" / "toy_bonus" / "s0x1"
  record = Workdir(str(run)).read_record()
  assert (record["algo"], record["algo_module"]) == ("toy_bonus", "my_algorithms")
  summary = json.loads((run / "summary.json").read_text())
  assert np.isfinite(summary["final_normalized_score"]).all()
  rows = (run / "metrics.csv").read_text().splitlines()
  assert len(rows) >= 2 and "nan" not in rows[-1]
  assert (tmp_path / "toy_bonus.msgpack").stat().st_size > 0
  assert (run / "mm_vs_mc.csv").exists()
  assert "toy_bonus" in (tmp_path / "runs" / "report.md").read_text().lower()
  # Here tmp_path is not on the path, and "toy_bonus" is TOY of another module: refused, naming it.
  assert str(tmp_path) not in sys.path
  with pytest.raises(UserError, match="module 'my_algorithms', which cannot be imported.*"
                     "PYTHONPATH"):
    config_from_record(record)
