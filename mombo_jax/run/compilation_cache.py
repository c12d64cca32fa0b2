"""JAX's persistent compilation cache for a launch: its default folder (--compilation_cache) and
switching it on."""
import os

from mombo_jax.run.console import log


def default_compilation_cache(environ=os.environ) -> str:
  """--compilation_cache's default: JAX's own JAX_COMPILATION_CACHE_DIR where set (one cache for
  a shell's, or a test session's, launches), else ~/.cache/mombo_jax/jax."""
  return environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join("~", ".cache", "mombo_jax", "jax")


DEFAULT_COMPILATION_CACHE = default_compilation_cache()


def enable_compilation_cache(path: str):
  """Points JAX's persistent compilation cache at `path` (~ expanded); "" leaves it off. Returns
  the folder used, or None. A folder that cannot be created only costs the cache (a note)."""
  if not path:
    return None
  path = os.path.expanduser(path)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    log(f"note: --compilation_cache={path} cannot be created ({e.strerror or e}); compiling "
        "without a persistent cache.")
    return None
  # JAX only here: experiments.run imports this module before its flags
  import jax
  jax.config.update("jax_compilation_cache_dir", path)
  return path
