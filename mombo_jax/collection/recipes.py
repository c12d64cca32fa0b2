"""D4RL-recipe datasets built here, written as real Minari datasets (docs/spec.md section 7).

Recipes (D4RL, Fu et al. 2020):
- random: `steps` steps of a uniform random policy.
- One online SAC run per environment (mombo_jax.collection.online_sac) gives the other qualities.
  Its deterministic evaluation return (`eval_episodes` episodes) is checked every `eval_every`
  steps; once `medium_consecutive` (default 2) evaluations in a row reach `medium_fraction` x the
  D4RL expert return, the policy of the last of them is snapshotted ("medium") and the replay buffer
  up to that step is `medium-replay`. Training continues to `sac_steps`; the final policy is the
  "expert".
- medium / expert: `steps` steps of the medium / final policy, actions sampled from the stochastic
  policy as D4RL did (rollout_policy="deterministic" uses tanh(mean)), many envs stepped together
  with one policy call per step.
- medium-expert: the episodes of medium followed by those of expert.
- <env>-random-<medium|expert>-<p>pct (Hong et al. 2023, the paper's appendix): as many transitions
  as the random dataset, p% of them from whole episodes of the medium / expert dataset, the rest
  from whole random episodes (whole episodes make the shares approximate).
Missing ingredients are built too; existing datasets are reused, never silently overwritten.
Datasets live under MINARI_DATASETS_PATH as `mombo/<env>/<quality>-v0` (names.minari_id), with
the D4RL reference returns and their provenance (recipe, size, rebuild command; the saved actors
they were recorded from and the SAC medium point where there are such) in the metadata, and a
dataset card beside them (mombo_jax.collection.cards).

Saved actors (mombo_jax.collection.saved_actors). The Builder saves the SAC run's medium / expert
actors to `<workdir>/<env>/actors/` as soon as it has them. Options.actors_only (collect
--actors_only) only exports them from the checkpoint (restore_sac: no training, nothing written to
the run). Options.from_actors (collect --from_actors=DIR) records medium / expert / medium-expert
from DIR's saved actors alone, through the same rollout / _policy_episodes (and seeds) as a SAC
build, so the same actor file and options give the same episodes; random and medium-replay (the SAC
run's replay buffer) are refused (Builder.check).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional, Sequence

import mombo_jax
from mombo_jax.collection import saved_actors
from mombo_jax.collection.dataset_writer import DatasetMetadata, write_dataset
from mombo_jax.collection.online_sac import SEED_OFFSETS, _print, online_config
from mombo_jax.collection.options import RECORD_FLAGS, SAC_FLAGS, Options, collect_command
from mombo_jax.collection.recording import (
  mix_episodes,
  random_policy,
  replay_episodes,
  rollout,
  sac_policy,
  summary,
)
from mombo_jax.collection.sac_checkpoints import SacResult, restore_sac
from mombo_jax.collection.sac_run import MediumPoint, SacSchedule, train_sac
from mombo_jax.data import minari_io, names, provenance as prov_lib
from mombo_jax.data.minari_io import read_episodes
from mombo_jax.data.names import parse_name
from mombo_jax.data.provenance import RECIPE_STEPS
from mombo_jax.data.scores import D4RL_REF_SCORES
from mombo_jax.env import envs
from mombo_jax.errors import UserError

SAC_QUALITIES = ("medium-replay", "medium", "expert", "medium-expert")


def provenance_for(name: str, recipe: str, steps: int) -> dict:
  """What `provenance.provenance` reads back: the recipe, the transitions written, the full
  recipe's size (None where it has none) and the command that rebuilds the dataset at full size."""
  return {"recipe": recipe, "steps": int(steps), "recipe_steps": RECIPE_STEPS.get(recipe),
          "command": f"python -m experiments.collect --env={name} --overwrite"}


def build_random(name: str, steps: int = 1_000_000, seed: int = 0, log_fn=_print,
                 max_episode_steps: Optional[int] = None, overwrite: bool = False,
                 num_envs: int = 1, should_stop=None) -> str:
  """Write `<env>-random`: `steps` transitions of a uniform random policy; returns its id.
  should_stop: as recording.rollout's (errors.Interrupted before anything is written)."""
  env, quality = parse_name(name)
  if quality != "random":
    raise ValueError(f"build_random builds <env>-random datasets, got {name!r}.")
  probe = envs.make_env(name, max_episode_steps=max_episode_steps)
  action_dim = probe.action_space.shape[0]
  probe.close()
  t0 = time.time()
  episodes = rollout(lambda: envs.make_env(name, max_episode_steps=max_episode_steps),
                     random_policy(action_dim, seed), steps, seed + SEED_OFFSETS["random"],
                     num_envs, should_stop=should_stop)
  elapsed = time.time() - t0
  log_fn(f"{name}: {summary(episodes)}; {steps / max(elapsed, 1e-9):.0f} steps/s")
  written = sum(len(ep["rewards"]) for ep in episodes)
  dataset_id = write_dataset(name, episodes, DatasetMetadata(
      f"{steps} steps of a uniform random policy on {envs.GYM_IDS[env]} (D4RL recipe).",
      "uniform-random", max_episode_steps, provenance=provenance_for(name, "random", written)),
      overwrite)
  log_fn(f"wrote {dataset_id} ({time.time() - t0:.1f} s in all)")
  return dataset_id


class Builder:
  """Builds named datasets, sharing one SAC run per environment. Saves the run's medium / expert
  actors (<workdir>/<env>/actors/) as soon as it has them; with opts.from_actors records medium /
  expert / medium-expert from saved actors instead; with opts.actors_only only exports actors."""

  def __init__(self, opts: Options, log_fn=_print, should_stop=None):
    if opts.from_actors and opts.actors_only:
      raise UserError("`from_actors` records datasets from saved actors; `actors_only` exports "
                      "actors from a SAC checkpoint: pass one of them.",
                      params=("from_actors", "actors_only"))
    self.opts = opts
    self.log = log_fn
    # A stop request (signals.StopFlag): the SAC run checkpoints where it is, a recording is
    # dropped (recorded again, the same episodes); both raise errors.Interrupted.
    self.should_stop = should_stop
    self._sac: Dict[str, SacResult] = {}
    self._saved: Dict[tuple, dict] = {}      # (env, quality) -> {"path", "sha256", "sac_step"}
    self._loaded: Dict[tuple, saved_actors.SavedActor] = {}
    self._recorded: Dict[tuple, List[dict]] = {}

  # -- helpers
  def _write(self, name, episodes, description, algorithm, overwrite=False, *,
             extra_provenance: Optional[dict] = None, command: Optional[str] = None):
    quality = parse_name(name)[1]
    recipe = "mixed" if quality.endswith("pct") else quality
    written = sum(len(ep["rewards"]) for ep in episodes)
    provenance = provenance_for(name, recipe, written)
    if command:
      provenance["command"] = command
    provenance.update(extra_provenance or {})
    # A reduced recipe beside the size (an expert actor from a shorter SAC run) is said in the
    # provenance, so the card and every run trained on the data say it too.
    reduced = list(provenance.get("reduced") or []) + prov_lib.expert_notes(
        provenance.get("actors"))
    if reduced:
      provenance["reduced"] = list(dict.fromkeys(reduced))
    dataset_id = write_dataset(name, episodes, DatasetMetadata(
        description, algorithm, self.opts.max_episode_steps, provenance=provenance), overwrite)
    self.log(f"wrote {dataset_id}: {summary(episodes)}")
    return dataset_id

  # -- saved actors
  def actors_dir(self, env: str) -> str:
    """Where the SAC run's actors are saved: <workdir>/<env>/actors."""
    return os.path.join(self.opts.workdir, env, "actors")

  def _save_actors(self, env: str, result: SacResult):
    """The medium actor once the run has its medium point; the expert once it is complete."""
    if result.medium_step >= 0:
      self._save_actor(env, "medium", result)
    if result.steps_done >= self.opts.sac_steps:
      self._save_actor(env, "expert", result)

  def _medium_record(self, result: SacResult) -> dict:
    """The medium point and the evaluations that made it (the last medium_consecutive up to it)."""
    o = self.opts
    evals = [[int(s), float(r)] for s, r in result.evals if s <= result.medium_step]
    return dict(medium_step=int(result.medium_step), medium_fraction=o.medium_fraction,
                medium_return=o.medium_fraction * D4RL_REF_SCORES[
                    result.config.env_name][1],
                medium_consecutive=o.medium_consecutive, eval_episodes=o.eval_episodes,
                qualifying_evals=evals[-o.medium_consecutive:])

  def _save_actor(self, env: str, quality: str, result: SacResult) -> dict:
    o = self.opts
    params = result.medium_actor if quality == "medium" else result.final_actor
    info = saved_actors.network_info(env, result.config, params)
    if quality == "medium":
      record = self._medium_record(result)
      info.update(sac_step=record.pop("medium_step"), **record)
    else:
      info.update(sac_step=int(result.steps_done),
                  final_eval=list(result.evals[-1]) if result.evals else None,
                  best_eval=list(result.best_eval), eval_episodes=o.eval_episodes)
    info.update(sac_steps=o.sac_steps, seed=o.seed, sac_seed=o.seed + SEED_OFFSETS["sac"],
                max_episode_steps=o.max_episode_steps, version=mombo_jax.__version__,
                git_commit=saved_actors.git_commit(),
                command=collect_command(f"{env}-{quality}", o, SAC_FLAGS),
                command_note="Retrains the SAC run in a fresh --workdir (an existing checkpoint "
                "there is resumed instead); the actor is saved to <workdir>/<env>/actors/. "
                "Datasets from this file alone: collect --from_actors=<its folder>.")
    directory = self.actors_dir(env)
    sidecar = saved_actors.save_actor(directory, quality, params, info)
    path = saved_actors.actor_paths(directory, quality)[0]
    self._saved[env, quality] = dict(path=path, sha256=sidecar["sha256"],
                                     sac_step=info["sac_step"])
    self.log(f"saved the {quality} actor (SAC step {info['sac_step']}) to {path} "
             f"({sidecar['bytes'] / 1024:.0f} KB) and its sidecar")
    return sidecar

  def export_actors(self, name: str):
    """--actors_only: save the actors behind `name` from the SAC run's checkpoint; trains, records
    and writes nothing else. Not while a build is still writing checkpoints to that workdir
    (opening them removes unfinished temporary checkpoint folders)."""
    o = self.opts
    env, quality = parse_name(name)
    wanted = saved_actors.ACTORS_OF.get(quality)
    if not wanted:
      raise UserError(f"{name} is recorded from no SAC actor: `actors_only` exports the actors "
                      "behind medium, medium-replay, expert and medium-expert.",
                      params=("actors_only",))
    workdir = os.path.join(o.workdir, env, "sac")
    if env not in self._sac:
      result = restore_sac(lambda: envs.make_env(env, max_episode_steps=o.max_episode_steps),
                           online_config(env, o.hidden, o.batch_size), o.sac_steps,
                           start_steps=o.start_steps, seed=o.seed + SEED_OFFSETS["sac"],
                           workdir=workdir)
      if result is None:
        raise UserError(f"No SAC checkpoint in {workdir}: pass the `workdir` (and the network "
                        f"flags) of the build that trained the {env} SAC run.", params=("workdir",))
      self._sac[env] = result
    result = self._sac[env]
    if "medium" in wanted:
      if result.medium_step < 0:
        raise UserError(f"The SAC run in {workdir} has not reached its medium point yet (step "
                        f"{result.steps_done}): build {env}-medium-replay or {env}-medium first, "
                        "without `actors_only`.", params=("actors_only",))
      self._save_actor(env, "medium", result)
    if "expert" in wanted:
      if result.steps_done < o.sac_steps:
        raise UserError(f"The SAC run in {workdir} is at step {result.steps_done}, not "
                        f"sac_steps={o.sac_steps}: build {env}-expert first (it resumes the "
                        "run), without `actors_only`, or pass the `sac_steps` it was run to.",
                        params=("sac_steps", "actors_only"))
      self._save_actor(env, "expert", result)
    return None

  def check(self, name: str):
    """UserError now, before anything runs, for a name this Builder's mode cannot build:
    --from_actors with random / medium-replay / mixed qualities or a missing actor file,
    --actors_only with a quality that has no actor."""
    env, quality = parse_name(name)
    if self.opts.actors_only and quality not in saved_actors.ACTORS_OF:
      raise UserError(f"{name} is recorded from no SAC actor: `actors_only` exports the actors "
                      "behind medium, medium-replay, expert and medium-expert.",
                      params=("actors_only",))
    if not self.opts.from_actors:
      return
    if quality == "random":
      raise UserError(f"{name} is a uniform random policy: it needs no saved actor; build it "
                      f"without --from_actors (python -m experiments.collect --env={name}).")
    if quality == "medium-replay":
      raise UserError(f"{name} is the replay buffer of the SAC run up to its medium point, which "
                      "no saved actor holds: it needs the SAC run (build it without "
                      "`from_actors`).", params=("from_actors",))
    if quality not in saved_actors.ACTORS_OF:
      partner = quality.split("-")[1]
      raise UserError(f"{name} mixes {env}-random with {env}-{partner}: build {env}-{partner} "
                      f"with `from_actors` first, then {name} without `from_actors` (it reuses "
                      "the existing ingredients).", params=("from_actors",))
    for q in saved_actors.ACTORS_OF[quality]:
      saved_actors.check_saved(self.opts.from_actors, q, env, name)

  def _saved_actor(self, env: str, quality: str) -> saved_actors.SavedActor:
    key = (env, quality)
    if key not in self._loaded:
      actor = saved_actors.load_actor(self.opts.from_actors, quality)
      if actor.info.get("env") != env:
        raise UserError(f"{actor.path} is an actor for {actor.info.get('env')}, not {env}.")
      self._loaded[key] = actor
    return self._loaded[key]

  def _actor_episodes(self, env: str, quality: str) -> List[dict]:
    """The episodes of the saved `quality` actor, recorded once per Builder (medium-expert reuses
    those of medium / expert built in the same command)."""
    key = (env, quality)
    if key not in self._recorded:
      actor = self._saved_actor(env, quality)
      self.log(f"recording {self.opts.steps} steps of {actor.path} (sha256 "
               f"{actor.sha256[:12]}..., SAC step {actor.info.get('sac_step')})")
      self._recorded[key] = self._policy_episodes(env, actor.params, actor.config, quality)
    return self._recorded[key]

  def _build_from_actors(self, name: str, overwrite: bool) -> str:
    o = self.opts
    env, quality = parse_name(name)
    qualities = saved_actors.ACTORS_OF[quality]
    episodes = [ep for q in qualities for ep in self._actor_episodes(env, q)]
    actors = {q: dict(path=self._saved_actor(env, q).path, sha256=self._saved_actor(env, q).sha256,
                      sac_step=self._saved_actor(env, q).info.get("sac_step")) for q in qualities}
    command = collect_command(name, o, RECORD_FLAGS, from_actors=o.from_actors, overwrite=True)
    made = " followed by ".join(
        f"{o.steps} steps of the {o.rollout_policy} SAC policy saved in {a['path']} (sha256 "
        f"{a['sha256']}, SAC step {a['sac_step']})" for a in actors.values())
    return self._write(name, episodes, f"{made} on {envs.GYM_IDS[env]} (D4RL recipe, recorded "
                       f"from saved actors). Rebuild: {command}", "SAC", overwrite,
                       extra_provenance={"actors": actors}, command=command)

  def sac_run(self, env: str, until_medium: bool = False) -> SacResult:
    """The environment's SAC run, trained to --sac_steps, or only up to its medium point when
    until_medium (medium and medium-replay need no more; an expert build later resumes it)."""
    cached = self._sac.get(env)
    if cached is not None and (cached.steps_done >= self.opts.sac_steps
                               or (until_medium and cached.medium_step >= 0)):
      return cached
    o = self.opts
    config = online_config(env, o.hidden, o.batch_size)
    expert_return = D4RL_REF_SCORES[env][1]
    medium_return = o.medium_fraction * expert_return
    workdir = os.path.join(o.workdir, env, "sac")
    self.log(f"SAC run on {envs.GYM_IDS[env]}: {o.sac_steps} steps, hidden {list(o.hidden)}, "
             f"medium point at eval return >= {medium_return:.1f} "
             f"({o.medium_fraction:.3g} x D4RL expert {expert_return}); checkpoints in {workdir}")
    schedule = SacSchedule(o.sac_steps, o.start_steps, o.eval_every, o.eval_episodes,
                           o.seed + SEED_OFFSETS["sac"], o.train_every, o.checkpoint_every,
                           o.log_every)
    medium = MediumPoint(medium_return, o.medium_consecutive, stop_at=until_medium)
    result = train_sac(lambda: envs.make_env(env, max_episode_steps=o.max_episode_steps), config,
                       schedule, medium, workdir=workdir, log_fn=self.log,
                       should_stop=self.should_stop)
    self._sac[env] = result
    self._save_actors(env, result)
    return result

  def _actor_provenance(self, env: str, qualities: Sequence[str]) -> dict:
    """{"actors": {quality: {"path", "sha256", "sac_step"}}} of the actors saved for this run."""
    actors = {q: self._saved[env, q] for q in qualities if (env, q) in self._saved}
    return {"actors": actors} if actors else {}

  def _medium_result(self, env: str) -> SacResult:
    result = self.sac_run(env, until_medium=True)
    if result.medium_step < 0:
      step, ret = result.best_eval
      raise UserError(
          f"The SAC run on {env} never reached the medium point ({self.opts.medium_fraction:.3g} x "
          f"expert return) in {self.opts.sac_steps} steps (best evaluation {ret:.1f} at step "
          f"{step}). Run again with a larger `sac_steps` (the run resumes, and its later "
          "evaluations are checked), or with a lower `medium_fraction` and a fresh `workdir`.",
          params=("sac_steps", "medium_fraction", "workdir"))
    return result

  def _policy_episodes(self, env: str, actor_params, config, seed_key: str) -> List[dict]:
    o = self.opts
    policy = sac_policy(actor_params, config, o.seed + SEED_OFFSETS[seed_key],
                        o.rollout_policy == "deterministic")
    t0 = time.time()
    episodes = rollout(lambda: envs.make_env(env, max_episode_steps=o.max_episode_steps), policy,
                       o.steps, o.seed + SEED_OFFSETS[seed_key], o.num_envs,
                       should_stop=self.should_stop)
    self.log(f"recorded {o.steps} {seed_key} steps at {o.steps / max(time.time() - t0, 1e-9):.0f}"
             " steps/s")
    return episodes

  def _episodes_of(self, name: str) -> List[dict]:
    """Episodes of an ingredient dataset: read when it exists, else built (and written) now."""
    if not minari_io.exists_locally(name):
      self.log(f"ingredient {name} is missing: building it")
      self.build(name, overwrite=False)
    return read_episodes(name)

  # -- the recipes
  def build(self, name: str, overwrite: Optional[bool] = None) -> Optional[str]:
    overwrite = self.opts.overwrite if overwrite is None else overwrite
    env, quality = parse_name(name)
    self.check(name)
    if self.opts.actors_only:
      return self.export_actors(name)
    if minari_io.exists_locally(name) and not overwrite:
      self.log(f"{names.minari_id(name)} already exists: skipped (pass --overwrite to rebuild it)")
      return None
    o = self.opts
    gym_id = envs.GYM_IDS[env]
    if o.from_actors:
      return self._build_from_actors(name, overwrite)
    if quality == "random":
      return build_random(name, o.steps, o.seed, self.log, o.max_episode_steps, overwrite=overwrite,
                          num_envs=1, should_stop=self.should_stop)
    if quality in SAC_QUALITIES:
      if quality == "medium-expert":
        episodes = self._episodes_of(f"{env}-medium") + self._episodes_of(f"{env}-expert")
        return self._write(name, episodes, f"{env}-medium followed by {env}-expert (D4RL recipe).",
                           "SAC", overwrite)
      if quality == "expert":
        result = self.sac_run(env)
        episodes = self._policy_episodes(env, result.final_actor, result.config, "expert")
        return self._write(name, episodes, f"{o.steps} steps of the {o.rollout_policy} SAC policy "
                           f"after {o.sac_steps} training steps on {gym_id} (D4RL recipe).", "SAC",
                           overwrite, extra_provenance=self._actor_provenance(env, ("expert",)))
      result = self._medium_result(env)
      medium = {"medium_point": self._medium_record(result)}
      if quality == "medium":
        episodes = self._policy_episodes(env, result.medium_actor, result.config, "medium")
        return self._write(name, episodes, f"{o.steps} steps of the {o.rollout_policy} SAC policy "
                           f"at its medium point (step {result.medium_step}, evaluation return >= "
                           f"{o.medium_fraction:.3g} x D4RL expert on {o.medium_consecutive} "
                           f"evaluations in a row) on {gym_id} (D4RL recipe).", "SAC", overwrite,
                           extra_provenance=dict(medium,
                                                 **self._actor_provenance(env, ("medium",))))
      episodes = replay_episodes(result.replay)
      return self._write(name, episodes, f"The replay buffer of a SAC run on {gym_id} up to its "
                         f"medium point (step {result.medium_step}, evaluation return >= "
                         f"{o.medium_fraction:.3g} x D4RL expert on {o.medium_consecutive} "
                         "evaluations in a row) (D4RL recipe).", "SAC", overwrite,
                         extra_provenance=medium)
    # Mixed: <random|...>-<partner>-<p>pct
    _, partner, pct = quality.split("-")
    percent = int(pct[:-3])
    random_eps = self._episodes_of(f"{env}-random")
    partner_eps = self._episodes_of(f"{env}-{partner}")
    wanted = percent / 100.0 * sum(len(ep["rewards"]) for ep in random_eps)
    available = sum(len(ep["rewards"]) for ep in partner_eps)
    if available < wanted:
      self.log(f"warning: {env}-{partner} has {available} transitions, fewer than the "
               f"{wanted:.0f} that {percent}% of {env}-random asks for; all of them are used")
    episodes = mix_episodes(random_eps, partner_eps, percent / 100.0,
                            o.seed + SEED_OFFSETS["mix"])
    # The ingredients' provenance (the partner's actor, a reduced recipe) carries over.
    ingredients = {q: prov_lib.provenance(f"{env}-{q}") or {} for q in ("random", partner)}
    extra = {"ingredients": {q: {k: p[k] for k in ("steps", "recipe_steps", "actors", "command")
                                 if k in p} for q, p in ingredients.items()}}
    # (A smaller random ingredient makes a smaller mix, which its size says; a smaller partner
    # matters only where it has fewer transitions than the share asks.)
    reduced = [f"{env}-{q}: {note}" for q, p in ingredients.items()
               for note in p.get("reduced") or []]
    if available < wanted:
      reduced.append(f"{env}-{partner} has {available:,} transitions where {percent}% asks "
                     f"{wanted:,.0f}: all of them are used")
    if reduced:
      extra["reduced"] = reduced
    return self._write(name, episodes, f"{env}-random with {percent}% of its transitions replaced "
                       f"by whole episodes of {env}-{partner} (Hong et al. 2023).", "mixture",
                       overwrite, extra_provenance=extra)
