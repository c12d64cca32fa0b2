"""The device record's profile summary (benchmarks/device/trace_summary.py) on a CPU trace of a
tiny program with the training code's named scopes: its ops are found in the trace JAX writes,
attributed to their phases through the compiled program's metadata, and counted per step."""
import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks.device import trace_summary

STEPS = 3


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
  """(trace folder, HLO text) of STEPS scanned steps: a rollout, a dynamics forward inside it, a
  critic update and an actor update, each under the scope the training code opens."""
  def step(w, x):
    with jax.named_scope("rollout"):
      with jax.named_scope(trace_summary.DYNAMICS):
        x = jnp.sin(x @ w) + jnp.cumsum(x, axis=0)
    with jax.named_scope("critic_update"):
      w = w - 1e-3 * jax.grad(lambda v: jnp.sum(jnp.tanh(x @ v) ** 2))(w)
    with jax.named_scope("actor_update"):
      w = w + 1e-3 * jnp.sort(x, axis=0)[:, :1].mean()
    return w, x.sum()

  fn = jax.jit(lambda w, x: jax.lax.scan(lambda c, _: step(c, x), w, None, length=STEPS))
  w, x = jnp.eye(64), jnp.linspace(0.0, 1.0, 64 * 64).reshape(64, 64)
  compiled = fn.lower(w, x).compile()
  jax.block_until_ready(compiled(w, x))
  folder = str(tmp_path_factory.mktemp("trace"))
  with jax.profiler.trace(folder):
    jax.block_until_ready(compiled(w, x))
  return folder, compiled.as_text()


def test_the_ops_are_attributed_to_their_phases(traced):
  folder, hlo = traced
  names = trace_summary.op_names(hlo)
  phases = {trace_summary.phase_of(n) for n in names.values()}
  assert {"rollout", "critic_update", "actor_update"} <= phases, sorted(phases)
  summary = trace_summary.summarise(folder, hlo, steps=STEPS)
  assert summary["kernels"] > 0 and summary["total_ms"] > 0
  # Every traced op is attributed to exactly one phase.
  assert sum(n for _, n in summary["phases"].values()) == pytest.approx(summary["kernels"])
  assert sum(ms for ms, _ in summary["phases"].values()) == pytest.approx(summary["total_ms"])
  ran = {p for p, (_, n) in summary["phases"].items() if n > 0}
  assert ran - {"other"}, summary["phases"]
  # The scan's loop is control flow, not a kernel: its body's ops count, the loop does not.
  assert not any(op.startswith("while") for _, op, _, _, _ in summary["top"])
  times = [ms for _, _, _, ms, _ in summary["top"]]
  assert times == sorted(times, reverse=True) and len(times) <= 10
  text = trace_summary.markdown(summary, "tiny")
  assert "| rollout |" in text and "kernels per gradient step" in text


def test_a_folder_without_a_trace_is_refused_naming_where_it_looks(tmp_path):
  with pytest.raises(FileNotFoundError, match="plugins/profile"):
    trace_summary.trace_file(str(tmp_path))


def test_phase_of_takes_the_outermost_scope():
  assert trace_summary.phase_of("jit(chunk)/while/body/rollout/EnsembleDynamics/dot") == "rollout"
  assert trace_summary.phase_of("jit(f)/critic_update/target/add") == "critic_update"
  assert trace_summary.phase_of("jit(f)/add") == "other"
  # Under transformations (the cells' vmap, the gradient's transpose) the scope is wrapped.
  assert trace_summary.phase_of("jit(one)/vmap(rollout)/while/body/dot") == "rollout"
  assert trace_summary.phase_of("transpose(jvp(actor_update))/Dense_0/dot") == "actor_update"


def _gpu_trace(folder, with_hlo_op):
  """A trace shaped as a GPU's: host events, and kernels in a /device:GPU:0 process."""
  run = folder / "plugins" / "profile" / "2026_11_27_00_00_00"
  run.mkdir(parents=True)
  kernel = lambda name, op, dur: {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": dur,  # noqa
                                  "name": name, "args": {"hlo_op": op, "hlo_module": "jit_chunk"}
                                  if with_hlo_op else {}}
  events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 500.0, "name": "host op",
             "args": {"hlo_op": "fusion.1"}},
            kernel("fusion_1", "fusion.1", 30.0), kernel("dot_2", "dot.2", 50.0),
            kernel("dot_2", "dot.2", 50.0)]
  with gzip.open(run / "host.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  return str(folder)


@pytest.mark.parametrize("with_hlo_op", [True, False])
def test_a_gpu_trace_counts_the_device_s_kernels_only(tmp_path, with_hlo_op):
  hlo = ('  %fusion.1 = f32[4] fusion(%p), kind=kLoop, metadata={op_name="jit(chunk)/vmap(rollout)'
         '/EnsembleDynamics/add"}\n  ROOT %dot.2 = f32[4,4] dot(%a, %b), metadata={op_name='
         '"jit(chunk)/transpose(jvp(critic_update))/dot_general"}\n')
  summary = trace_summary.summarise(_gpu_trace(tmp_path, with_hlo_op), hlo, steps=2)
  assert summary["kernels"] == 3 and summary["total_ms"] == pytest.approx(0.13)  # no host op
  assert summary["phases"]["rollout"] == pytest.approx((0.03, 1))
  assert summary["phases"]["critic_update"] == pytest.approx((0.1, 2))
  assert summary["dynamics"] == pytest.approx((0.03, 1))
  assert summary["per_step"] == pytest.approx(1.0)                 # 2 kernels over 2 steps
