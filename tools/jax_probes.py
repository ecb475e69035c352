"""What this JAX release has: the API-presence and behaviour probes of the matrix.

Run by ``tools/jax_matrix.py`` inside each release's venv (jax and numpy only,
so it runs even where the package itself would not import); prints one JSON
object ``{probe name: true | false}`` on stdout. A probe is true when the API
exists / the behaviour holds, false otherwise; each probe's meaning is its
docstring, which the compatibility page shows.

    python tools/jax_probes.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")

import importlib
import inspect
import json
import warnings

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

PROBES = {}


def probe(fn):
    PROBES[fn.__name__] = fn
    return fn


def _mesh():
    return jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))


def _module_attr(module, name):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


@probe
def jax_shard_map():
    """`jax.shard_map` (the public home of shard_map)."""
    return hasattr(jax, "shard_map")


@probe
def experimental_shard_map():
    """`jax.experimental.shard_map.shard_map` (the old home).

    Instead: `jax.shard_map(f, mesh=mesh, ...)`.
    """
    return _module_attr("jax.experimental.shard_map", "shard_map")


@probe
def shard_map_check_vma():
    """`jax.shard_map(..., check_vma=...)`."""
    return "check_vma" in inspect.signature(jax.shard_map).parameters


@probe
def shard_map_check_rep():
    """`jax.shard_map(..., check_rep=...)`.

    Instead: `check_vma=...` (the old shard_map's `check_rep`).
    """
    return "check_rep" in inspect.signature(jax.shard_map).parameters


@probe
def lax_pvary():
    """`lax.pvary(x, axis)`.

    Instead: `lax.pcast(x, axis, to="varying")`.
    """
    return hasattr(lax, "pvary")


@probe
def lax_pcast_varying():
    """`lax.pcast(x, axis, to="varying")` runs inside shard_map."""
    if not hasattr(lax, "pcast"):
        return False
    f = jax.shard_map(lambda x: lax.pcast(x, "i", to="varying") * 1.0,
                      mesh=_mesh(), in_specs=P(), out_specs=P("i"))
    return np.asarray(f(np.ones(8, np.float32))).shape == (64,)


@probe
def lax_all_gather_invariant():
    """`lax.all_gather_invariant` (public).

    Instead: `lax.all_gather(..., to="invarying")`.
    """
    return hasattr(lax, "all_gather_invariant")


@probe
def private_all_gather_invariant():
    """`jax._src.lax.parallel.all_gather_invariant` (private) is typed invariant.

    Instead: `lax.all_gather(..., to="invarying")` where it exists.
    """
    from jax._src.lax import parallel

    f = jax.shard_map(
        lambda x: parallel.all_gather_invariant(x, "i", tiled=True),
        mesh=_mesh(), in_specs=P("i"), out_specs=P())
    x = np.arange(16.0, dtype=np.float32)
    return bool(np.array_equal(np.asarray(f(x)), x))


@probe
def all_gather_to_invarying():
    """`lax.all_gather(..., to="invarying")` with `out_specs=P()`."""
    if "to" not in inspect.signature(lax.all_gather).parameters:
        return False
    f = jax.shard_map(lambda x: lax.all_gather(x, "i", tiled=True, to="invarying"),
                      mesh=_mesh(), in_specs=P("i"), out_specs=P())
    x = np.arange(16.0, dtype=np.float32)
    return bool(np.array_equal(np.asarray(f(x)), x))


def _varying_aval():
    seen = []

    def body(x):
        y = x * lax.axis_index("i")
        seen.append(jax.typeof(y))
        return y

    jax.shard_map(body, mesh=_mesh(), in_specs=P(), out_specs=P("i"))(
        np.ones(1, np.float32))
    return seen[0]


@probe
def aval_vma():
    """`jax.typeof(x).vma` holds the axes a value varies over.

    Instead: `jax.typeof(x).mat.varying`.
    """
    return set(getattr(_varying_aval(), "vma", ())) == {"i"}


@probe
def aval_mat_varying():
    """`jax.typeof(x).mat.varying` holds the axes a value varies over."""
    return set(getattr(getattr(_varying_aval(), "mat", None), "varying", ())) == {"i"}


@probe
def make_mesh_default_explicit():
    """`jax.make_mesh` without `axis_types` gives Explicit axes.

    Instead: pass `axis_types` (`collectives.make_mesh` gives Auto axes).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mesh = jax.make_mesh((8,), ("i",))
    return all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


@probe
def make_mesh_warns_about_default():
    """`jax.make_mesh` without `axis_types` warns that the default will change.

    Instead: pass `axis_types`; a test suite with `-W error` fails otherwise.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.make_mesh((8,), ("i",))
    return any(issubclass(w.category, DeprecationWarning)
               and "axis_types" in str(w.message) for w in caught)


@probe
def config_jax_num_cpu_devices():
    """The `jax_num_cpu_devices` config option.

    Instead: `collectives.use_cpu_devices(n)`.
    """
    return "jax_num_cpu_devices" in jax.config.values


@probe
def pmap_runs_on_shard_map():
    """`jax.pmap` traces to a shard_map (not `xla_pmap`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jaxpr = jax.make_jaxpr(jax.pmap(lambda x: lax.psum(x, "i"), "i"))(
            np.ones((8, 2), np.float32))
    return "shard_map" in str(jaxpr) and "xla_pmap" not in str(jaxpr)


@probe
def device_put_sharded():
    """`jax.device_put_sharded` / `device_put_replicated`.

    Instead: `jax.device_put(x, NamedSharding(mesh, spec))` (migration guide).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated on 0.8
        return all(hasattr(jax, name)
                   for name in ("device_put_sharded", "device_put_replicated"))


@probe
def experimental_pjit():
    """`jax.experimental.pjit.pjit`.

    Instead: `jax.jit(f, in_shardings=..., out_shardings=...)`.
    """
    return _module_attr("jax.experimental.pjit", "pjit")


@probe
def experimental_maps_xmap():
    """`jax.experimental.maps.xmap`.

    Instead: `jax.shard_map` over a mesh, or `jax.vmap(axis_name=...)`.
    """
    return _module_attr("jax.experimental.maps", "xmap")


@probe
def positional_sharding():
    """`jax.sharding.PositionalSharding`.

    Instead: `NamedSharding(mesh, P("a", "b"))`.
    """
    return hasattr(jax.sharding, "PositionalSharding")


@probe
def lax_psend_precv():
    """`lax.psend` / `lax.precv` (public; GPU only, CPU raises).

    Instead: `lax.ppermute(x, axis, pairs)`.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated on 0.12
        return hasattr(lax, "psend") and hasattr(lax, "precv")


@probe
def shard_map_checks_explicit_input_specs():
    """On an Explicit mesh, shard_map rejects an input not placed as `in_specs` says.

    Instead: `jax.device_put(x, NamedSharding(mesh, spec))` first, or an Auto mesh
    (`guides/sharp_edges_sharding.py`, 1).
    """
    mesh = jax.make_mesh((8,), ("i",),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    f = jax.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                      out_specs=P())
    try:
        jax.jit(f)(np.ones(16, np.float32))
    except ValueError as err:
        return "does not match the specs of the input" in str(err)
    return False


@probe
def ppermute_checks_axis_order():
    """`lax.ppermute` over axes out of mesh order raises (not silently reorders).

    Instead: pass the axes in mesh order (`guides/sharp_edges_ppermute.py`, 10).
    """
    mesh = jax.make_mesh((4, 2), ("i", "j"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    perm = [(s, (s + 1) % 8) for s in range(8)]
    f = jax.shard_map(lambda x: lax.ppermute(x, ("j", "i"), perm), mesh=mesh,
                      in_specs=P(("j", "i")), out_specs=P(("j", "i")))
    try:
        jax.jit(f)(np.zeros(8, np.float32))
    except RuntimeError as err:
        return "same order" in str(err)
    return False


@probe
def vmap_of_shard_map_psum():
    """`vmap` of a shard_map'd psum (check_vma on) runs and is right (jax#34249).

    Instead: `check_vma=False` on that shard_map, or the jit form
    (`guides/sharp_edges_versions.py`, 12).
    """
    f = jax.shard_map(lambda x: lax.psum(x, "i"), mesh=_mesh(),
                      in_specs=P("i"), out_specs=P())
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    got = np.asarray(jax.vmap(f)(x))
    return bool(np.array_equal(got, x.sum(1, keepdims=True)))


@probe
def psum_scatter_negative_dimension():
    """`lax.psum_scatter(..., scatter_dimension=-1)` lowers (jax#20125).

    Instead: `scatter_dimension=dim % x.ndim` (`guides/sharp_edges_versions.py`, 13).
    """
    f = jax.shard_map(
        lambda x: lax.psum_scatter(x, "i", scatter_dimension=-1, tiled=True),
        mesh=_mesh(), in_specs=P("i"), out_specs=P("i"))
    x = np.ones((8, 16), np.float32)
    return bool(np.array_equal(np.asarray(f(x)), np.full((8, 2), 8.0)))


def run_probes() -> dict[str, bool]:
    """Every probe; one that raises counts as false."""
    results = {}
    for name, fn in PROBES.items():
        try:
            results[name] = bool(fn())
        except Exception:  # an API that is missing or broken: false
            results[name] = False
    return results


def describe() -> dict[str, str]:
    """Probe name -> its one-line meaning."""
    return {name: inspect.getdoc(fn) for name, fn in PROBES.items()}


if __name__ == "__main__":
    print(json.dumps(run_probes(), indent=1))
