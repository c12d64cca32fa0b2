"""End-to-end runs of launch.train_runs (experiments.run's launch) on a tiny locally built dataset
(CI-sized), plus the properties the training loop promises: kill-and-resume = one run, and the
moment-matching critic at zero variance = the plain critic inside the update. Seeds vmapped = seeds
run alone is tested where it is strongest: a grid cell resumed alone = a single run (test_grid.py),
seeds over 4 devices = on 1 (test_sharding.py), one seed per process = both seeds in one
(test_distributed.py)."""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer, cells_program, dynamics, placement, sac, train as train_lib
from mombo_jax.data import provenance, scores, transitions as transitions_lib
from mombo_jax.dynamics import dynamics_store, reuse
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import compilation_cache, launch, preflight, run_dataset, run_state
from mombo_jax.settings import config as config_lib
from tests.conftest import HANG_S
from tests.launches import train_run

DATASET = "hopper-random"
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1)


@pytest.fixture(scope="module")
def dataset(hopper_random_2000):
  return hopper_random_2000


@pytest.fixture(scope="module")
def dyn_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("dynamics"))


def _config(algo="mombo", **kw):
  return config_lib.make_config(DATASET, algo, preset="tiny", **{**TINY, **kw})


def _final_params(workdir):
  state, _ = run_state.restore(Workdir(workdir))
  return state


@pytest.fixture(scope="module")
def mombo_run(dataset, dyn_dir, tmp_path_factory):
  """One uninterrupted 2-seed MOMBO run, shared by the end-to-end and resume tests."""
  workdir = tmp_path_factory.mktemp("mombo_run")
  return workdir, train_run(_config("mombo", num_seeds=2), dataset, str(workdir),
                                   dynamics_dir=dyn_dir)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["mombo", "mobile", "mopo"])
def test_end_to_end(dataset, dyn_dir, tmp_path, algo, request):
  config = _config(algo, num_seeds=2)
  if algo == "mombo":
    tmp_path, summary = request.getfixturevalue("mombo_run")
  else:
    summary = train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir)
  assert summary["seeds"] == [0, 1]
  assert len(summary["final_normalized_score"]) == 2
  assert np.all(np.isfinite(summary["aulc"]))
  with open(tmp_path / "metrics.csv") as f:
    rows = f.read().strip().splitlines()
  assert len(rows) == 1 + config.epochs * 2        # header + one row per seed per evaluation
  assert "critic_loss" in rows[0] and "normalized_score" in rows[0]
  assert (tmp_path / "learning_curve.png").stat().st_size > 0
  assert json.loads((tmp_path / "summary.json").read_text())["seeds"] == [0, 1]
  assert json.loads((tmp_path / "config.json").read_text())["reference"] == config.reference
  # Overestimation watch: the critics' mean Q against the dataset's return bound, per seed.
  header = rows[0].split(",")
  assert {"q_mean", "q_bound", "overestimated"} <= set(header)
  real = transitions_lib.load_transitions(dataset).rewards
  bound = float(np.abs(real).max()) / (1 - config.agent.gamma)
  assert summary["q_bound"] == pytest.approx(bound, rel=1e-5)
  assert len(summary["q_mean_last"]) == len(summary["q_mean_max"]) == 2
  assert all(np.isfinite(q) and m >= q for q, m in zip(summary["q_mean_last"],
                                                          summary["q_mean_max"]))
  assert summary["overestimated"] == [m > bound for m in summary["q_mean_max"]]


@pytest.mark.parametrize("algo, reference, code", [
    ("mobile", None, "OfflineRL-Kit run_example/run_mobile.py"),
    ("mobile", "authors", "yihaosun1124/mobile configs/gym"),
    ("mombo", None, "adinlab/MOMBO configs/gym")])
def test_the_opening_line_names_the_settings_source(minari_root, tmp_path, capsys, algo,
                                                    reference, code):
  """Printed before anything long (here: before the dataset, which is missing, is loaded)."""
  config = config_lib.make_config("walker2d-medium-expert", algo, reference=reference)
  with pytest.raises(UserError, match="not in the local Minari root"):
    train_run(config, "walker2d-medium-expert", str(tmp_path / "run"))
  first = capsys.readouterr().out.splitlines()[0]
  assert first.startswith(f"{algo.upper()} settings (--reference={config.reference}): {code}")
  every = {"mombo": "every 50 epochs.", "mobile": "every 10 epochs"}[algo]
  assert f"evaluation {every}" in first
  assert (("the reference evaluates every epoch" in first)
          == (reference is None and algo == "mobile"))


@pytest.mark.slow
def test_the_python_call_is_the_launch_of_the_same_run(dataset, dyn_dir, tmp_path, mombo_run):
  """mombo_jax.fit (experiments.run's own path: fit.plan, fit.fit_runs) trains the run the launch
  trains: the same summary and rows; a grid asked for in one run's terms is refused before any
  work."""
  import mombo_jax
  straight, summary = mombo_run
  got = mombo_jax.fit(DATASET, "mombo", preset="tiny", seeds=2, workdir=str(tmp_path / "fit"),
                      dynamics_dir=dyn_dir, **TINY)
  assert got == summary
  _assert_same_rows(Workdir(str(tmp_path / "fit")).read_rows(),
                    Workdir(str(straight)).read_rows())
  with pytest.raises(UserError, match="not both"):
    mombo_jax.fit(DATASET, preset="tiny", betas=[1.0, 2.0], beta=3.0,
                  workdir=str(tmp_path / "grid"))
  assert not os.path.exists(tmp_path / "grid")


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(dataset, dyn_dir, tmp_path, mombo_run):
  straight, _ = mombo_run
  config = _config("mombo", num_seeds=2)
  assert train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir,
                          stop_after=1) is None
  with open(tmp_path / "metrics.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 1 * 2
  # Resumed at epoch 1, one more epoch finishes the run: a run that restarted from scratch would
  # stop again after its first epoch and return None.
  summary = train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir, stop_after=1)
  assert summary is not None
  jax.tree.map(np.testing.assert_array_equal, _final_params(str(straight)),
               _final_params(str(tmp_path)))
  with open(tmp_path / "metrics.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 2 * 2
  assert summary["epochs"] == [1, 2]
  # The overestimation watch (in the checkpoint's metadata) resumes with the run.
  for key in ("q_mean_last", "q_mean_max"):
    assert summary[key] == pytest.approx(mombo_run[1][key], rel=1e-6)
  assert summary["overestimated"] == mombo_run[1]["overestimated"]


def test_the_epoch_compiles_once_per_run(dataset, dyn_dir, tmp_path, monkeypatch, capsys):
  """Three epochs, each evaluated and checkpointed: the device call (cells_program.make_cells_chunk)
  is traced and compiled once, ahead of the loop, and the log says so once (the rate after it
  excludes compilation)."""
  import functools
  traces, compiles = [], []
  make_epoch = train_lib.make_epoch

  def counting_make_epoch(config, per_cell=(), choices=None):
    epoch = make_epoch(config, per_cell, choices)

    @functools.wraps(epoch)
    def counted(*args):
      traces.append(1)
      return epoch(*args)
    return counted

  def on_event(event, duration, fun_name="", **kw):
    del duration, kw
    if event == "/jax/core/compile/backend_compile_duration" and fun_name == "jit(chunk)":
      compiles.append(fun_name)

  monkeypatch.setattr(train_lib, "make_epoch", counting_make_epoch)
  cells_program._cells_chunk.cache_clear()        # no compiled chunk of an earlier test is reused
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    # steps_per_epoch=3: a program no other test compiles, so XLA cannot serve it from memory.
    summary = train_run(_config("mombo", epochs=3, steps_per_epoch=3), dataset,
                               str(tmp_path), dynamics_dir=dyn_dir)
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
    cells_program._cells_chunk.cache_clear()
  assert summary["epochs"] == [1, 2, 3]
  assert len(traces) == 1, f"the epoch was traced {len(traces)} times"
  assert compiles == ["jit(chunk)"], compiles
  out = capsys.readouterr().out
  assert out.count("Compiled the epoch in") == 1, out
  # The log names MOMBO's variant (the default: the released code's elite_spread).
  assert "Algorithm: MOMBO, target elite_spread (the released code's)" in out, out
  assert out.index("Compiled the epoch in") < out.index("epoch 1/3")
  assert out.count(" steps/s ") == 3
  # The speed is of training alone, a moving average over the recent epochs, and says so.
  assert out.count("training alone: evaluations and checkpoints apart; moving average over up "
                   "to the last 3 epochs") == 3, out
  assert re.search(r"Seeds sharded over 1 \w+ device\(s\), 1 per device", out), out
  # The dataset's opening line says which physics its policies are evaluated in.
  assert re.search(r"hopper-random: \d+ transitions, obs dim 11, action dim 3; evaluated in "
                   r"Hopper-v5 in its v5 model \(hopper.xml\)\.", out), out
  # The final line sets the score beside the dataset's own episodes' mean normalised return.
  own = scores.normalized_score(
      DATASET, transitions_lib.episode_returns(transitions_lib.load_transitions(DATASET)))
  final = next(line for line in out.splitlines() if line.startswith("final normalised score"))
  assert f" (dataset's own episodes: mean {own.mean():.1f}), AULC " in final, final


def test_the_progress_speed_is_a_moving_average_of_the_recent_intervals():
  """A fast start then a slow stretch: the progress line's steps/s follows the recent pace (the
  last RATE_POINTS intervals), not the launch-long mean, which a fast start would inflate."""
  from mombo_jax.run import host_run
  pace = host_run.Pace(0, 0.0)
  pace.trained(1.0)
  assert pace.rate(10, 1.0, 100) == pytest.approx((1000.0, 1000.0))   # 10 epochs in 1 s
  for k in range(1, host_run.RATE_POINTS + 1):                        # then 10 epochs per 10 s
    pace.trained(10.0)
    rate, _ = pace.rate(10 + 10 * k, 1.0 + 10.0 * k, 100)
  assert rate == pytest.approx(100.0)
  assert 40 * 100 / 31.0 > 1.2 * rate            # the launch-long mean would read 129


def test_the_progress_speed_is_of_training_and_the_eta_of_the_launch():
  """A tiny run read 64 steps/s after 1,493: its second interval held the first evaluation. The
  line's steps/s counts the device calls' time alone; the ETA's pace counts everything."""
  from mombo_jax.run import host_run
  pace = host_run.Pace(0, 0.0)
  pace.trained(0.5)
  assert pace.rate(1, 0.5, 1000) == pytest.approx((2000.0, 2000.0))
  pace.trained(0.5)                                 # 0.5 s of training after a 10 s evaluation
  training, wall = pace.rate(2, 11.0, 1000)
  assert training == pytest.approx(2000.0) and wall == pytest.approx(2000 / 11.0)


def test_compilation_cache_flag(tmp_path, capsys):
  old = jax.config.jax_compilation_cache_dir
  try:
    assert compilation_cache.enable_compilation_cache("") is None
    assert jax.config.jax_compilation_cache_dir == old
    afile = tmp_path / "afile"
    afile.write_text("x")
    # A folder that cannot be created is a note, not a failure.
    assert compilation_cache.enable_compilation_cache(str(afile / "cache")) is None
    assert "compiling without a persistent cache" in capsys.readouterr().out
    assert jax.config.jax_compilation_cache_dir == old
    path = compilation_cache.enable_compilation_cache(str(tmp_path / "cache" / "jax"))
    assert path == str(tmp_path / "cache" / "jax") and os.path.isdir(path)
    assert jax.config.jax_compilation_cache_dir == path
    assert compilation_cache.default_compilation_cache({}).startswith("~")
    assert compilation_cache.default_compilation_cache({"JAX_COMPILATION_CACHE_DIR": "/c"}) == "/c"
  finally:
    jax.config.update("jax_compilation_cache_dir", old)


def test_changed_config_refuses_workdir(dataset, dyn_dir, tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"beta": 123.0}))
  with pytest.raises(UserError, match="another config"):
    train_run(_config("mombo"), dataset, str(tmp_path), dynamics_dir=dyn_dir)


def test_missing_dataset_names_the_command(minari_root, tmp_path):
  with pytest.raises(UserError, match="experiments.collect"):
    train_run(_config("mombo"), "hopper-medium-replay", str(tmp_path))
  # A failed launch leaves no config.json behind, so the corrected command is not blocked.
  assert not (tmp_path / "config.json").exists()


def test_missing_sac_datasets_are_built_only_when_asked(minari_root, tmp_path, monkeypatch):
  """The quick/tiny default builds missing random datasets only; --build_missing hands any short
  name (SAC-based, mixed) to the collector; a Minari id is never built."""
  calls = []
  monkeypatch.setattr(run_dataset, "run_child", lambda cmd, *a: calls.append(cmd) or 1)
  config = _config("mombo")
  with pytest.raises(UserError, match="build_missing=True"):
    run_dataset.load_or_build("hopper-random-medium-1pct", config, "random", 5000)
  assert calls == []
  with pytest.raises(UserError, match="Building hopper-random-medium-1pct failed"):
    run_dataset.load_or_build("hopper-random-medium-1pct", config, True, 5000)
  assert calls and calls[0][1:] == ["-m", "experiments.collect", "--env=hopper-random-medium-1pct",
                                    "--steps=5000", "--seed=0"]
  with pytest.raises(UserError, match="is not in the local Minari root"):
    run_dataset.load_or_build("someone/hopper/other-v0", config, True, 5000)
  assert len(calls) == 1


@pytest.fixture(scope="module")
def tiny_setup(dataset):
  real = buffer.from_transitions(transitions_lib.load_transitions(dataset))
  config = _config("mombo")
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, real.obs.shape[1], real.action.shape[1],
                                               config))(keys)
  return config, real, keys, dyn


def test_mm_critic_at_zero_variance_matches_plain_update(tiny_setup):
  """With zero state variance the MOMBO actor update (MM mean) equals the plain-Q actor update."""
  config, real, keys, dyn = tiny_setup
  plain_cfg = config.replace(algo="mobile")
  agent = sac.init_agent(keys[0], real.obs.shape[1], real.action.shape[1], config, total_steps=10)
  batch = jax.tree.map(lambda x: x[:32], real)
  assert float(jnp.abs(batch.obs_var).max()) == 0.0
  target_fn = lambda ag, b, k: (b.reward, {})  # noqa: E731
  update = jax.jit(sac.update, static_argnums=(3, 4))
  mm_agent, mm_m = update(agent, batch, keys[1], target_fn, config)
  pl_agent, pl_m = update(agent, batch, keys[1], target_fn, plain_cfg)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               mm_agent.actor.params, pl_agent.actor.params)
  np.testing.assert_allclose(mm_m["actor_loss"], pl_m["actor_loss"], rtol=1e-6)
  # And with state variance the MM actor loss differs (the switch is live).
  noisy = batch.replace(obs_var=jnp.full_like(batch.obs_var, 0.5))
  _, noisy_m = update(agent, noisy, keys[1], target_fn, config)
  assert abs(float(noisy_m["actor_loss"]) - float(mm_m["actor_loss"])) > 1e-4


# ------------------------------------------------------------------------------ refusals up front

def test_dataset_of_another_env_is_refused(dataset, tmp_path):
  walker = config_lib.make_config("walker2d-random", "mombo", preset="tiny", **TINY)
  for name in ("mombo/hopper/random-v0", "hopper-random"):
    with pytest.raises(UserError, match="holds hopper data.*walker2d"):
      train_run(walker, name, str(tmp_path / "w"))
  assert not (tmp_path / "w" / "config.json").exists()


def test_reduced_build_refused_with_paper_settings(dataset, tmp_path):
  """The test dataset is a 2,000-step build of the 1M-step random recipe."""
  assert provenance.provenance(dataset)["steps"] < provenance.provenance(dataset)["recipe_steps"]
  with pytest.raises(UserError, match="reduced build.*experiments.collect --env=hopper-random "
                     "--overwrite.*--allow_small_dataset"):
    train_run(_config("mombo"), dataset, str(tmp_path), require_full=True)
  assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(keep=0), "`keep`"), (dict(stop_after=0), "`stop_after`"),
    (dict(build_steps=0), "`build_steps`")])
def test_bad_run_arguments_are_refused(tmp_path, kwargs, match):
  with pytest.raises(UserError, match=match):
    preflight.validate(_config("mombo"), DATASET, str(tmp_path), **kwargs)


def test_bad_workdirs_are_refused(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  with pytest.raises(UserError, match="workdir=.*is a file"):
    preflight.validate(_config("mombo"), DATASET, str(afile))
  with pytest.raises(UserError, match="workdir=.*cannot be created"):
    preflight.validate(_config("mombo"), DATASET, str(afile / "sub"))
  with pytest.raises(UserError, match="dynamics_dir=.*is a file"):
    preflight.validate(_config("mombo"), DATASET, str(tmp_path / "ok"), dynamics_dir=str(afile))
  with pytest.raises(UserError, match="Unknown dataset name"):
    preflight.validate(_config("mombo"), "hopper-randm", str(tmp_path / "ok"))


def _run_cli(args, env_extra=None, timeout=HANG_S):
  import subprocess
  import sys
  env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
  return subprocess.run([sys.executable, "-m", "experiments.run"] + args, capture_output=True,
                        text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("flag", ["--epochs=-1", "--beta=nan", "--eval_every=0",
                                  "--keep_checkpoints=0", "--reference=offlinerl_kit"])
def test_cli_refuses_bad_flags_in_one_line_before_any_work(tmp_path, flag):
  out = _run_cli([flag, "--env=hopper-random", f"--workdir={tmp_path / 'w'}"],
                 {"MINARI_DATASETS_PATH": str(tmp_path / "empty")})
  assert out.returncode != 0
  assert "Traceback" not in out.stderr
  lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
  assert flag.split("=")[0].lstrip("-") in lines[0]
  assert not (tmp_path / "w" / "config.json").exists()


def test_stray_words_are_refused_naming_the_boolean_trap(tmp_path):
  """absl leaves words it does not parse in argv; every entry point refuses them (_cli.stray_words)
  instead of ignoring them. `--allow_epochs_change false` set the flag to True and left "false"."""
  from experiments._cli import stray_words
  assert stray_words([]) is None
  assert "unexpected argument(s) stray" in stray_words(["stray"])
  assert "boolean" not in stray_words(["stray"])
  assert "--flag=false" in stray_words(["False"])
  out = _run_cli(["--env=hopper-random", "--allow_epochs_change", "false",
                  f"--workdir={tmp_path / 'w'}"], {"MINARI_DATASETS_PATH": str(tmp_path / "e")})
  assert out.returncode != 0 and "Traceback" not in out.stderr
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == ["error: " + stray_words(["false"])], out.stderr
  assert not (tmp_path / "w").exists()


def test_epochs_change_needs_consent_and_is_recorded(tmp_path):
  first, _ = Workdir(str(tmp_path)).check_config(_config("mombo"), DATASET)
  (tmp_path / "config.json").write_text(json.dumps(first))
  longer = _config("mombo", epochs=5, eval_every=2)
  with pytest.raises(UserError, match="allow_epochs_change"):
    Workdir(str(tmp_path)).check_config(longer, DATASET)
  new, notes = Workdir(str(tmp_path)).check_config(longer, DATASET, allow_epochs_change=True)
  assert new["epochs"] == 5 and new["epochs_changes"][0]["from"] == 2
  assert "re-spanned" in new["epochs_changes"][0]["actor_lr_schedule"]
  assert any("eval_every" in n for n in notes)
  # eval_every / eval_episodes alone may change freely.
  Workdir(str(tmp_path)).check_config(_config("mombo", eval_episodes=3), DATASET)
  # With a fixed schedule (the paper preset's) a longer run keeps it: the run stays a prefix.
  fixed, _ = Workdir(str(tmp_path / "x")).check_config(_config("mombo", schedule_epochs=9),
                                                       DATASET)
  (tmp_path / "x").mkdir()
  (tmp_path / "x" / "config.json").write_text(json.dumps(fixed))
  new, notes = Workdir(str(tmp_path / "x")).check_config(
      _config("mombo", epochs=5, schedule_epochs=9), DATASET, allow_epochs_change=True)
  assert (new["schedule_epochs"] == 9
          and "unchanged" in new["epochs_changes"][0]["actor_lr_schedule"])


def test_dynamics_of_another_setup_are_refused(dataset, dyn_dir, tmp_path, mombo_run):
  """mombo_run saved ensembles for seeds 0-1 in dyn_dir. The same settings on other data (the
  dataset rebuilt: fewer transitions, another fingerprint) are refused naming what differs; other
  dynamics settings live in another folder and train their own (tests/test_dynamics_reuse.py)."""
  config = _config("mombo", num_seeds=2)
  full = transitions_lib.load_transitions(DATASET)
  fewer = type(full)(*(np.asarray(x)[:1500] for x in full))
  with pytest.raises(UserError, match="another setup.*num_transitions: saved 2000, now 1500"):
    dynamics_store.get_dynamics(config, fewer, DATASET, dyn_dir,
                                console=dynamics_store.Console(lambda _: None))
  other = _config("mombo", num_seeds=2, dyn_members=4)
  assert (reuse.dynamics_path(dyn_dir, other)
          != reuse.dynamics_path(dyn_dir, config))


# ----------------------------------------------------------------------------------- divergence

@pytest.mark.slow
def test_a_diverging_seed_is_frozen_and_the_others_finish_unchanged(dataset, dyn_dir, tmp_path,
                                                                    mombo_run, monkeypatch):
  straight_dir, straight = mombo_run
  compile_chunk = launch.compile_chunk

  def poisoning(program):
    """The launch's device call, with NaN put into seed 0's critics before epoch 1 (as a
    diverging update would leave them)."""
    chunk = compile_chunk(program)

    def call(state, real, keys, cells, start, n):
      if int(start) == 1:
        critic = jax.tree.map(lambda x: x.at[0].set(jnp.nan), state.agent.critic.params)
        state = placement.shard_cells(state.replace(agent=state.agent.replace(
            critic=state.agent.critic.replace(params=critic))))
      return chunk(state, real, keys, cells, start, n)
    return call

  monkeypatch.setattr(launch, "compile_chunk", poisoning)
  summary = train_run(_config("mombo", num_seeds=2), dataset, str(tmp_path),
                             dynamics_dir=dyn_dir)
  monkeypatch.undo()
  assert [(d["seed"], d["epoch"]) for d in summary["diverged"]] == [(0, 2)]
  assert "params" in summary["diverged"][0]["quantity"]
  # Seed 1 trained exactly as in the run where nothing diverged (same compiled program).
  assert summary["final_normalized_score"][1] == straight["final_normalized_score"][1]
  assert summary["aulc"][1] == straight["aulc"][1]
  # Every seed counts: seed 0, frozen at its last healthy state, is still evaluated at every
  # evaluation (finite scores, its rows flagged) and is in the headline; the healthy seed's
  # figure is beside it.
  rows = outputs.read_rows(str(tmp_path / "metrics.csv"))
  frozen = [r for r in rows if r["seed"] == 0]
  assert [r["epoch"] for r in frozen] == summary["epochs"]
  assert all(np.isfinite(r["normalized_score"]) for r in frozen)
  assert [r["diverged"] for r in frozen if r["epoch"] >= 2] == [1.0] * len(
      [e for e in summary["epochs"] if e >= 2])
  assert summary["final_normalized_score_mean"] == pytest.approx(
      np.mean(summary["final_normalized_score"]))
  assert (summary["num_seeds"], summary["num_diverged"]) == (2, 1)
  assert summary["final_normalized_score_mean_healthy"] == summary["final_normalized_score"][1]
  assert summary["final_normalized_score_std_healthy"] == 0.0
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[1], b[1]),
               _final_params(str(straight_dir)).agent, _final_params(str(tmp_path)).agent)
  assert json.loads((tmp_path / "summary.json").read_text())["diverged"][0]["seed"] == 0
  # Resuming a finished run with a diverged seed keeps the record (it lives in the checkpoint).
  again = train_run(_config("mombo", num_seeds=2), dataset, str(tmp_path),
                           dynamics_dir=dyn_dir)
  assert again["diverged"] == summary["diverged"]


# -------------------------------------------------------------------------------------- signals

def _interrupt_at(args, env_extra, trigger, sig):
  """Starts experiments.run, sends `sig` once a stdout line contains `trigger`; returns
  (exit code, output)."""
  import signal as _signal
  import subprocess
  import sys
  env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
  proc = subprocess.Popen([sys.executable, "-m", "experiments.run"] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if trigger in line:
      proc.send_signal(sig)
      break
  rest, _ = proc.communicate(timeout=HANG_S)
  assert _signal.Signals(sig) in (_signal.SIGINT, _signal.SIGTERM)
  return proc.returncode, "".join(seen) + rest


@pytest.mark.slow
def test_sigterm_and_sigint_checkpoint_and_resume_to_the_same_summary(dataset, minari_root,
                                                                        tmp_path):
  import signal as _signal
  overrides = dict(epochs=3, dyn_max_epochs=4)
  args = ["--env=hopper-random", "--preset=tiny", "--epochs=3", "--dynamics_max_epochs=4",
          "--steps_per_epoch=5", "--rollout_batch_size=32", f"--workdir={tmp_path / 'cli'}"]
  env = {"MINARI_DATASETS_PATH": str(minari_root)}
  # Mid-dynamics: the dynamics epoch ends, its state is saved, and the run says how to resume.
  code, out = _interrupt_at(args, env, "dynamics epoch 1:", _signal.SIGTERM)
  assert code == 143, out
  assert "Traceback" not in out and "Resume with:" in out and "dynamics epoch" in out
  partial = reuse.dynamics_path(str(tmp_path / "cli" / "dynamics"), config_lib.make_config(
      DATASET, "mombo", preset="tiny", dyn_max_epochs=4)) + ".partial"
  assert os.path.isdir(partial)
  # Mid-training (Ctrl-C): the epoch finishes and is checkpointed.
  code, out = _interrupt_at(args, env, "epoch 1/3", _signal.SIGINT)
  assert code == 130, out
  assert "resumed unfinished training" in out and "Traceback" not in out
  assert not os.path.exists(partial)
  done = _run_cli(args, env, timeout=HANG_S)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "Resumed from" in done.stdout
  interrupted = json.loads((tmp_path / "cli" / "summary.json").read_text())
  # The same run without interruptions, in this process.
  cfg = config_lib.make_config(DATASET, "mombo", preset="tiny", steps_per_epoch=5,
                               rollout_batch_size=32, **overrides)
  straight = train_run(cfg, DATASET, str(tmp_path / "straight"))
  assert interrupted["epochs"] == straight["epochs"] == [1, 2, 3]
  np.testing.assert_allclose(interrupted["final_normalized_score"],
                             straight["final_normalized_score"], rtol=1e-6)
  np.testing.assert_allclose(interrupted["aulc"], straight["aulc"], rtol=1e-6)


@pytest.mark.slow
def test_the_loaded_policy_reproduces_the_runs_evaluation_returns(mombo_run):
  """Each seed of a finished run, loaded as a plain Policy (mombo_jax.load_policy) and stepped in
  a plain env with its actions, returns what the run's last evaluation recorded in metrics.csv, on
  the env seeds that evaluation used (evaluation.returns_all: Evaluator.run(actors, seed=10_000 *
  config.seed + epoch), env (s, e) reset with evaluate.env_seeds(that, S, episodes)[s, e])."""
  from mombo_jax import load_policy
  from mombo_jax.env import envs, evaluate
  workdir, _ = mombo_run
  wd = Workdir(str(workdir))
  config, _ = wd.read_config()
  rows = wd.read_rows()
  last = max(r["epoch"] for r in rows)
  env_seeds = evaluate.env_seeds(10_000 * config.seed + last, config.num_seeds,
                                 config.evaluation.eval_episodes)
  env = envs.make_env(config.env_name)
  try:
    for i, seed in enumerate(range(config.seed, config.seed + config.num_seeds)):
      policy = load_policy(str(workdir), seed=seed)
      assert (policy.seed, policy.epoch) == (seed, last)
      returns = []
      for env_seed in env_seeds[i]:
        obs, _ = env.reset(seed=int(env_seed))
        total, done = 0.0, False
        while not done:
          obs, reward, terminated, truncated, _ = env.step(policy(obs))
          total, done = total + float(reward), terminated or truncated
        returns.append(total)
      recorded = [r["return_mean"] for r in rows if (r["epoch"], r["seed"]) == (last, seed)]
      assert len(recorded) == 1
      assert np.mean(returns) == pytest.approx(recorded[0], rel=1e-4), (seed, returns)
  finally:
    env.close()


def test_tensorboard_logger_follows_metrics_csv_across_a_resume(dataset, dyn_dir, tmp_path):
  """train_run(log_to=("csv", "tensorboard")) stopped after epoch 1 and resumed: each seed's
  TensorBoard run (<workdir>/tb/seed<s>) holds every metrics.csv evaluation once, at its gradient
  step (the purge of a killed launch's events: test_loggers.py)."""
  from mombo_jax.run import loggers
  config, log = _config("mombo", num_seeds=2), ("csv", "tensorboard")
  assert train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir, stop_after=1,
                          log_to=log) is None
  assert train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir,
                          log_to=log) is not None
  rows = Workdir(str(tmp_path)).read_rows()
  for s in (0, 1):
    series = loggers.read_tensorboard(str(tmp_path / "tb" / f"seed{s}"))
    assert not [tag for tag in series if tag.endswith("#duplicate")]
    mine = [r for r in rows if r["seed"] == s]
    for tag, key in [("eval/normalized_score", "normalized_score"),
                     ("train/critic_loss", "critic_loss"), ("health/q_bound", "q_bound")]:
      assert [step for step, _ in series[tag]] == [r["step"] for r in mine] == [5, 10]
      assert [v for _, v in series[tag]] == pytest.approx([r[key] for r in mine], rel=1e-5)


def test_cli_refuses_an_unknown_logger_before_any_work(tmp_path):
  out = _run_cli(["--log=csv,tensorbord", "--env=hopper-random", f"--workdir={tmp_path / 'w'}"],
                 {"MINARI_DATASETS_PATH": str(tmp_path / "empty")})
  assert out.returncode == 2 and "Traceback" not in out.stderr     # a value --log cannot take
  lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and "unknown logger(s) tensorbord; valid: csv, tensorboard, wandb" in \
      lines[0], out.stderr
  assert not (tmp_path / "w").exists()


def _assert_same_rows(a, b):
  """Two metrics.csv's row lists: the same epochs, seeds and columns, the values equal (to float
  noise)."""
  assert [(r["epoch"], r["seed"]) for r in a] == [(r["epoch"], r["seed"]) for r in b]
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      assert x[k] == pytest.approx(y[k], rel=1e-6, nan_ok=True), (x["epoch"], x["seed"], k)


@pytest.mark.slow
def test_a_resume_writes_the_rows_of_an_evaluation_the_killed_launch_lost(dataset, dyn_dir,
                                                                          tmp_path, mombo_run,
                                                                          capsys):
  """The evaluation of epoch E runs while the device trains on; a launch killed after E's
  checkpoint but before E's rows reached metrics.csv resumes by evaluating the restored actors
  with E's env seeds and writing those rows first: metrics.csv ends as an uninterrupted run's."""
  straight, _ = mombo_run
  config = _config("mombo", num_seeds=2)
  assert train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir,
                          stop_after=1) is None
  wd = Workdir(str(tmp_path))
  assert [r["epoch"] for r in wd.read_rows()] == [1, 1]
  wd.write_rows([])                         # the kill: checkpoint at epoch 1, no rows of it
  capsys.readouterr()
  assert train_run(config, dataset, str(tmp_path), dynamics_dir=dyn_dir) is not None
  assert "Wrote the evaluation of epoch 1" in capsys.readouterr().out
  _assert_same_rows(wd.read_rows(), Workdir(str(straight)).read_rows())


def test_evaluation_overlaps_the_next_device_call(dataset, dyn_dir, tmp_path, mombo_run,
                                                  monkeypatch):
  """The evaluation of epoch 1 (a background thread) is still running when the device call of
  epoch 2 is dispatched: the fake returns wait for that dispatch (a sequential loop would make
  them time out). The rows are the same as an uninterrupted run's."""
  import threading

  from mombo_jax.run import evaluation
  straight, _ = mombo_run
  dispatched, waited = threading.Event(), {}
  compile_chunk, returns_all = launch.compile_chunk, evaluation.returns_all

  def watched_compile(program):
    chunk = compile_chunk(program)

    def call(state, real, keys, cells, start, n):
      if int(start) >= 1:
        dispatched.set()
      return chunk(state, real, keys, cells, start, n)
    return call

  def slow_returns(runs, actors, done, should_stop=None):
    if done == 1:
      # A guard, not a speed claim: a sequential loop never dispatches while this waits, so
      # only a hang reaches it; a loaded machine dispatching slowly does not.
      waited[done] = (dispatched.wait(timeout=300), threading.current_thread().name)
    return returns_all(runs, actors, done, should_stop)

  monkeypatch.setattr(launch, "compile_chunk", watched_compile)
  monkeypatch.setattr(evaluation, "returns_all", slow_returns)
  assert train_run(_config("mombo", num_seeds=2), dataset, str(tmp_path),
                          dynamics_dir=dyn_dir) is not None
  ok, thread = waited[1]
  assert ok, "the device call of epoch 2 waited for the evaluation of epoch 1"
  assert thread != threading.main_thread().name
  _assert_same_rows(Workdir(str(tmp_path)).read_rows(), Workdir(str(straight)).read_rows())
