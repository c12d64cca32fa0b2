"""mombo_jax/run/sweep.py (behind experiments.sweep): the grid of entries, shared dynamics,
skip-when-finished, failure and interruption records, the status history, finished entries of
another setup refused, only validated flags passed on, SIGTERM's exit status, an unwritable --out;
one real tiny sweep through the CLI."""
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from mombo_jax import errors
from mombo_jax.run import console, sweep, sweep_record
from tests.conftest import HANG_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = dict(preset="tiny", epochs=1, steps_per_epoch=5, rollout_batch_size=32, eval_episodes=1,
              dynamics_max_epochs=2)


def _entries(out, envs=("hopper-random", "walker2d-random"), algos=("mombo", "mopo"), extra=(),
           **budget):
  return sweep.plan(list(envs), list(algos), seeds=2, seed=0, out=str(out),
                    budget={**BUDGET, **budget}, extra=extra, python="python3")


def _finish(entry, diverged=()):
  """What experiments.run leaves in a finished entry's folder, as far as the sweep reads it: the
  config.json of the entry's config and a summary.json."""
  from mombo_jax.records import workdir
  wd = workdir.Workdir(entry.workdir)
  wd.write_config(workdir.config_record(entry.config, entry.env))
  wd.write_summary({"diverged": [{"seed": s, "epoch": 1, "quantity": "params"}
                                 for s in diverged]})


def test_plan_is_dataset_major_with_shared_dynamics(tmp_path):
  entries = _entries(tmp_path)
  assert [(c.env, c.algo) for c in entries] == [
      ("hopper-random", "mombo"), ("hopper-random", "mopo"),
      ("walker2d-random", "mombo"), ("walker2d-random", "mopo")]
  assert entries[0].workdir == str(tmp_path / "hopper-random" / "mombo-elite_spread" / "s0x2")
  assert entries[1].workdir == str(tmp_path / "hopper-random" / "mopo" / "s0x2")
  assert entries[0].dynamics_dir == entries[1].dynamics_dir != entries[2].dynamics_dir
  cmd = entries[1].command
  assert cmd[:3] == ("python3", "-m", "experiments.run")
  for flag in ("--env=hopper-random", "--algo=mopo", "--seeds=2", "--seed=0", "--preset=tiny",
               "--epochs=1", "--dynamics_max_epochs=2",
               f"--dynamics_dir={entries[1].dynamics_dir}"):
    assert flag in cmd, (flag, cmd)
  assert _entries(tmp_path, target="mixture")[0].workdir.endswith(
      os.path.join("mombo-mixture", "s0x2"))


def test_a_sweep_chooses_the_settings_source(tmp_path):
  entries = _entries(tmp_path, envs=("hopper-medium",), algos=("mombo", "mobile"), reference=None)
  assert [c.config.reference for c in entries] == ["authors", "offlinerl_kit"]
  assert entries[1].workdir == str(tmp_path / "hopper-medium" / "mobile" / "s0x2")
  entries = _entries(tmp_path, envs=("hopper-medium",), algos=("mombo", "mobile"),
                     reference="authors")
  assert [c.config.reference for c in entries] == ["authors", "authors"]
  assert entries[1].workdir == str(tmp_path / "hopper-medium" / "mobile-authors" / "s0x2")
  assert entries[0].workdir == str(tmp_path / "hopper-medium" / "mombo-elite_spread" / "s0x2")
  assert "--reference=authors" in entries[1].command
  with pytest.raises(errors.UserError, match="hopper-medium / mopo: Unknown reference 'authors'"):
    _entries(tmp_path, envs=("hopper-medium",), algos=("mobile", "mopo"), reference="authors")


@pytest.mark.parametrize("preset", ["paper", "quick"])
def test_entries_share_an_ensemble_exactly_when_their_dynamics_settings_agree(tmp_path, preset):
  """walker2d-medium over the three algorithms (issue #26): the references' sources may set other
  dynamics settings for it (e.g. an epoch cap), so which entries share is computed from the entries'
  configs, not assumed. Entries with equal settings share one folder, others do not; the plan
  names each ensemble's entries, the settings that keep them apart and each value's source."""
  from mombo_jax.dynamics import reuse
  from mombo_jax.settings import config as config_lib, references
  env, algos = "walker2d-medium", ("mombo", "mobile", "mopo")
  entries = sweep.plan([env], list(algos), seeds=3, seed=0, out=str(tmp_path),
                     budget={"preset": preset})
  settings = {c.algo: reuse.training_settings(c.config) for c in entries}
  paths = {c.algo: c.dynamics_path for c in entries}
  for a in algos:
    for b in algos:
      assert (paths[a] == paths[b]) == (settings[a] == settings[b]), (a, b)
  assert all(p.startswith(entries[0].dynamics_dir + os.sep) for p in paths.values())
  lines = sweep.dynamics_plan(entries, {"preset": preset})
  text = "\n".join(lines)
  groups = {}
  for a in algos:
    groups.setdefault(paths[a], []).append(a)
  assert lines[0].startswith(f"dynamics of {env}: {len(groups)} ensemble(s) for 3 entries")
  for path, users in groups.items():
    assert (f"shared by {', '.join(users)}: {path}" if len(users) > 1
            else f"{users[0]} alone: {path}") in [line.strip() for line in lines]
  apart = [f for f in reuse.TRAINING_FIELDS
           if len({repr(s[f]) for s in settings.values()}) > 1]
  assert bool(apart) == (len(groups) > 1)
  if apart:
    assert f"apart because these settings differ: {', '.join(apart)}" in lines[0]
  default = config_lib.Config().settings()
  for c in entries:                                  # every value set by the algorithm's source
    table = config_lib.task_overrides(env, c.algo, c.config.reference)
    values = c.config.settings()
    for f in reuse.TRAINING_FIELDS:
      if f in table and values[f] != default[f] and \
          f not in config_lib.PRESETS[preset].overrides:
        code = references.source(c.algo, c.config.reference).code
        assert f"{f}={values[f]!r}: " in text and code in text, (c.algo, f)
  if preset == "quick":                            # the preset's cap overrides every table's
    assert {c.config.dynamics_training.dyn_max_epochs for c in entries} == {2}
    assert "dyn_max_epochs=2: preset quick" in text


def test_the_sweep_prints_its_dynamics_plan(tmp_path):
  out = subprocess.run([sys.executable, "-m", "experiments.sweep", "--envs=walker2d-medium",
                        "--algos=mombo,mobile,mopo", "--seeds=2", f"--out={tmp_path}",
                        "--dry_run"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("# dynamics of walker2d-medium: ")
  assert all(line.startswith("#") or line.startswith(sys.executable) for line in lines)


@pytest.mark.parametrize("bad, match", [
    (dict(envs=("hopper-foo",)), "Unknown dataset name 'hopper-foo'"),
    (dict(algos=("mombo", "sac")), "Unknown algo 'sac'"),
    (dict(epochs=-1), "epochs"),
    (dict(envs=()), "`envs` is required"),
    (dict(algos=("mopo", "mopo")), "must not repeat"),
])
def test_plan_refuses_bad_input_before_anything_runs(tmp_path, bad, match):
  with pytest.raises(errors.UserError, match=match):
    _entries(tmp_path / "out", **bad)
  assert not os.path.exists(tmp_path / "out")


def test_run_records_statuses_skips_finished_entries_and_stops_after_an_interrupt(tmp_path):
  entries = _entries(tmp_path)
  codes = {("hopper-random", "mombo"): 0, ("hopper-random", "mopo"): 1,
           ("walker2d-random", "mombo"): console.EXIT_DIVERGED, ("walker2d-random", "mopo"): 0}
  launched = []

  def runner(entry):
    launched.append((entry.env, entry.algo))
    code = codes[(entry.env, entry.algo)]
    if code in (0, console.EXIT_DIVERGED):      # experiments.run writes summary.json then
      _finish(entry)
    return code

  result = sweep.run_sweep(entries, str(tmp_path), runner=runner, log=lambda *_: None)
  assert launched == list(codes)
  assert [e["status"] for e in result["cells"]] == ["finished", "failed", "diverged", "finished"]
  assert result["status"] == "failed" and sweep_record.exit_code(result) == 1
  assert json.loads((tmp_path / "sweep.json").read_text()) == result

  # Again: only the failed entry is launched (the others have their summary.json). The diverged
  # entry stays diverged (never overwritten by "skipped"), so the sweep still exits 3.
  launched.clear()
  codes[("hopper-random", "mopo")] = 0
  result = sweep.run_sweep(entries, str(tmp_path), runner=runner, log=lambda *_: None)
  assert launched == [("hopper-random", "mopo")]
  assert [e["status"] for e in result["cells"]] == ["finished", "finished", "diverged", "finished"]
  assert [e["skipped"] for e in result["cells"]] == [True, False, True, True]
  assert result["status"] == "diverged" and sweep_record.exit_code(result) == console.EXIT_DIVERGED
  assert "(3 skipped: finished before)" in sweep_record.summary(result, str(tmp_path))
  # Each entry's history over both sweeps, oldest first, with the command and time of each.
  histories = [[h["status"] for h in e["history"]] for e in result["cells"]]
  assert histories == [["finished", "skipped"], ["failed", "finished"], ["diverged", "skipped"],
                       ["finished", "skipped"]]
  assert all(h["command"] == e["command"] and h["time"] for e in result["cells"]
             for h in e["history"])
  assert json.loads((tmp_path / "sweep.json").read_text()) == result

  # An interrupted entry stops the sweep: later entries are not launched; the exit status is the
  # signal's (SIGINT 130, SIGTERM 143).
  for code, signum in ((130, signal.SIGINT), (143, signal.SIGTERM), (-15, signal.SIGTERM)):
    fresh = _entries(tmp_path / f"other{code}")
    launched.clear()
    result = sweep.run_sweep(fresh, str(tmp_path / f"other{code}"),
                             runner=lambda c, code=code: launched.append(c) or code,
                             log=lambda *_: None)
    assert len(launched) == 1
    assert [e["status"] for e in result["cells"]] == ["interrupted"] + ["not started"] * 3
    assert result["signal"] == signum and sweep_record.exit_code(result) == 128 + signum


def test_a_summary_listing_diverged_seeds_makes_a_skipped_entry_diverged(tmp_path):
  entries = _entries(tmp_path, envs=("hopper-random",), algos=("mopo",))
  _finish(entries[0], diverged=(1,))
  result = sweep.run_sweep(entries, str(tmp_path), runner=lambda c: pytest.fail("launched"),
                           log=lambda *_: None)
  assert result["cells"][0]["status"] == "diverged" and result["cells"][0]["skipped"]
  assert sweep_record.exit_code(result) == console.EXIT_DIVERGED


def test_finished_entries_of_another_setup_are_refused_naming_the_fields(tmp_path):
  entries = _entries(tmp_path)
  for c in entries:
    _finish(c)
  record = (tmp_path / "sweep.json")
  never = lambda c: pytest.fail(f"{c.name} launched")   # noqa: E731
  # Another budget over the finished entries: refused before anything runs, naming entry and field.
  with pytest.raises(errors.UserError) as e:
    sweep.run_sweep(_entries(tmp_path, epochs=2, steps_per_epoch=6), str(tmp_path), runner=never,
                    log=lambda *_: None)
  msg = str(e.value)
  assert "4 entries hold a run of another setup" in msg and "nothing was launched" in msg
  assert "hopper-random mombo-elite_spread" in msg and "epochs: 1 -> 2" in msg
  assert "steps_per_epoch: 5 -> 6" in msg and "\n" not in msg
  assert "--allow_epochs_change" not in msg    # more than epochs differs
  assert not record.exists()
  # Evaluation fields: a finished entry's evaluations are done, so they count there ...
  with pytest.raises(errors.UserError, match="eval_episodes: 1 -> 3"):
    sweep.run_sweep(_entries(tmp_path, eval_episodes=3), str(tmp_path), runner=never,
                    log=lambda *_: None)
  # ... but not for an unfinished one, which experiments.run resumes under the new ones.
  os.remove(os.path.join(entries[0].workdir, "summary.json"))
  assert sweep.check_entries(_entries(tmp_path, envs=("hopper-random",), algos=("mombo",),
                                  eval_episodes=3)) == set()
  # Only --epochs: refused with the way to continue, which then relaunches the finished entries.
  with pytest.raises(errors.UserError, match="allow_epochs_change"):
    sweep.check_entries(_entries(tmp_path, epochs=3))
  longer = _entries(tmp_path, epochs=3, extra=["--allow_epochs_change"])
  assert sweep.check_entries(longer) == {c.workdir for c in entries[1:]}
  launched = []
  sweep.run_sweep(longer, str(tmp_path), runner=lambda c: launched.append(c) or 0,
                  log=lambda *_: None)
  assert launched == longer
  assert all("--allow_epochs_change" in c.command for c in launched)
  # Another beta names other folders: launched beside the old entries, nothing refused.
  betas = _entries(tmp_path, beta=0.5)
  assert all(re.search(r"-beta0.5/s0x2$", c.workdir) for c in betas)
  assert sweep.check_entries(betas) == set()


def test_only_validated_flags_are_passed_on(tmp_path):
  assert sweep.check_passthrough(["--keep_checkpoints=2", "--download", "--nobuild_missing",
                                  "--allow_small_dataset=false", "--compilation_cache="]) == dict(
      keep_checkpoints=2, download=True, build_missing=False, allow_small_dataset=False,
      compilation_cache="")
  for words, match in [(["stray"], "unexpected argument 'stray'"),
                       (["beta=0.1"], "unexpected argument 'beta=0.1'"),
                       (["--beta=0.1"], "pass --beta to the sweep itself, before `--`"),
                       (["--epochs=3"], "pass --epochs to the sweep itself"),
                       (["--workdir=x"], "the sweep sets --workdir"),
                       (["--betas=1,2"], "the sweep sets --betas"),
                       (["--stop_after=1"], "does not pass --stop_after on"),
                       (["--frobnicate=1"], "not a flag a sweep passes on"),
                       (["--keep_checkpoints=two"], "takes an integer"),
                       (["--keep_checkpoints"], "give --keep_checkpoints its value"),
                       (["--download=maybe"], "takes true or false")]:
    with pytest.raises(errors.UserError, match=re.escape(match)):
      _entries(tmp_path / "out", extra=words)
  assert not os.path.exists(tmp_path / "out")
  # Every flag passed on is one experiments.run defines, with the type the sweep checks.
  with open(os.path.join(REPO, "experiments", "run.py")) as f:
    defined = dict((n, k) for k, n in re.findall(r'DEFINE_(\w+)\("(\w+)"', f.read()))
  for name, kind in {**sweep.PASSTHROUGH_FLAGS, **sweep.BUDGET_FLAGS}.items():
    assert defined.get(name) in ({"string": ("string", "enum")}.get(kind) or (kind,)), name


def test_an_unwritable_out_is_one_line_before_any_launch(tmp_path, monkeypatch):
  blocker = tmp_path / "file"
  blocker.write_text("")
  entries = _entries(blocker / "sweep")
  never = lambda c: pytest.fail("launched")   # noqa: E731
  with pytest.raises(errors.UserError, match=re.escape(f"Cannot write {blocker / 'sweep'}: Not a "
                                                        "directory")):
    sweep.run_sweep(entries, str(blocker / "sweep"), runner=never, log=lambda *_: None)
  # A read-only file system (tests run as root, where permissions do not stop writes): the OS's
  # refusal of the record's rename, simulated.
  out = tmp_path / "ro"
  real = os.replace

  def refuse(src, dst):
    if str(dst).endswith("sweep.json"):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
    return real(src, dst)

  monkeypatch.setattr(os, "replace", refuse)
  with pytest.raises(errors.UserError) as e:
    sweep.run_sweep(_entries(out), str(out), runner=never, log=lambda *_: None)
  assert str(e.value) == (f"Cannot write {out / 'sweep.json'}: Read-only file system; pass a "
                          "folder on a writable file system.")
  assert os.listdir(out) == [".sweep.lock"]   # the temporary record is gone (the lock's file
                                              # stays, held by nobody)


_CHILD = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
          "print('ready', flush=True); time.sleep(600)")
_SWEEP = """
import sys
from mombo_jax.run import sweep, sweep_record
out = sys.argv[1]
child = (sys.executable, "-c", sys.argv[2])
entries = [sweep.SweepEntry("hopper-random", a, f"{out}/{a}", f"{out}/dynamics", child)
         for a in ("mopo", "mombo")]
launcher = sweep.Launcher()
launcher.install()
result = sweep.run_sweep(entries, out, runner=launcher)
print(sweep_record.summary(result, out))
sys.exit(sweep_record.exit_code(result))
"""


def test_sigterm_stops_the_sweep_with_143(tmp_path):
  """A real sweep process: SIGTERM is forwarded once to the running entry (which exits 143 as
  experiments.run does after its checkpoint), no further entry starts, the sweep exits 143."""
  proc = subprocess.Popen([sys.executable, "-c", _SWEEP, str(tmp_path), _CHILD], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + HANG_S
    while time.time() < deadline:
      line = proc.stdout.readline()
      if line.strip() == "ready" or not line:
        break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_S)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 128 + signal.SIGTERM, err
  assert "sweep interrupted: 1 interrupted, 1 not started" in out
  record = json.loads((tmp_path / "sweep.json").read_text())
  assert record["signal"] == signal.SIGTERM
  assert [c["exit_code"] for c in record["cells"]] == [143, None]


@pytest.mark.slow
def test_cli_runs_a_tiny_sweep_and_skips_it_when_run_again(minari_root, hopper_random_2000,
                                                           tmp_path):
  out = tmp_path / "sweep"
  cmd = [sys.executable, "-m", "experiments.sweep", "--envs=hopper-random", "--algos=mopo",
         "--seeds=1", f"--out={out}"] + [f"--{k}={v}" for k, v in BUDGET.items()]
  env = dict(os.environ, MINARI_DATASETS_PATH=str(minari_root), HF_HUB_OFFLINE="1")
  first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  workdir = out / "hopper-random" / "mopo" / "s0x1"
  assert (workdir / "summary.json").exists() and (out / "hopper-random" / "dynamics").is_dir()
  assert "sweep finished: 1 finished" in first.stdout
  again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  assert again.returncode == 0 and "1 finished (1 skipped: finished before)" in again.stdout
  # The same sweep with another budget over the finished entry: refused, naming the field.
  other = subprocess.run(cmd + ["--steps_per_epoch=6"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=HANG_S)
  assert other.returncode == 1 and "steps_per_epoch: 5 -> 6" in other.stderr
  bad = subprocess.run(cmd[:3] + ["--envs=hopper-foo", f"--out={out}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=HANG_S)
  assert bad.returncode == 2 and bad.stderr.strip().startswith("error:")   # a bad --envs value
  assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("words, match, code", [
    (["stray", "beta=0.1"], "unexpected argument(s) stray beta=0.1", 2),
    (["--out=FILE/sweep", "--", "--keep_checkpoints=2"], "Cannot write FILE/sweep: Not a directory",
     1),
])
def test_cli_refuses_stray_words_and_an_unwritable_out_in_one_line(tmp_path, words, match, code):
  blocker = tmp_path / "file"
  blocker.write_text("")
  words = [w.replace("FILE", str(blocker)) for w in words]
  out = [] if any(w.startswith("--out") for w in words) else [f"--out={tmp_path / 'sweep'}"]
  got = subprocess.run([sys.executable, "-m", "experiments.sweep", "--envs=hopper-random",
                        "--algos=mopo"] + out + words, cwd=REPO, capture_output=True, text=True,
                       timeout=HANG_S)
  assert got.returncode == code and "Traceback" not in got.stderr, got.stderr
  lines = got.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:")
  assert match.replace("FILE", str(blocker)) in lines[0], lines[0]
  assert not (tmp_path / "sweep").exists()
