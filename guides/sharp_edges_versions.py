"""Sharp edges of single JAX releases: code that breaks on one version only.

What it shows, each as the plain code and the workaround that runs on every
release from 0.8.0 to the newest (docs/compatibility.md lists where each
bites, from the release matrix):

  12. ``jax.vmap`` of a shard_map'd ``lax.psum`` (``check_vma=True``, the
      default) raises on JAX 0.8.1 only: "TypeError:
      _psum_invariant_abstract_eval() got an unexpected keyword argument
      'axis_index_groups'" (jax-ml/jax#34249). pmean and a psum inside a
      ``vmap`` in the body hit it too. Workaround: ``check_vma=False`` on
      that shard_map (the output spec is then not checked: the body must
      reduce over every axis its ``P()`` output does not name), or the jit
      form, which needs no shard_map.
  13. ``lax.psum_scatter(x, axis, scatter_dimension=-1)`` fails to compile
      before JAX 0.11: "'stablehlo.reduce_scatter' op attribute
      'scatter_dimension' failed to satisfy constraint: ... non-negative"
      (jax-ml/jax#20125); pmap and shard_map alike. Workaround: pass the
      dimension counted from the front, ``scatter_dimension % x.ndim``.

Which form when: the jit form sidesteps both (no named collectives); keep
the workarounds in shard_map and pmap code that must run on older releases.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: every release 0.8.0 to 0.12.0.1 (docs/compatibility.md).
Run: ``python guides/sharp_edges_versions.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


# [start:pmap]
def scatter_last_pmap(x, n_devices, dim=-1):
    # x: f32[n*k, m] global; each device holds k rows and keeps m/n columns
    # of the sum over devices. dim=-1 is pitfall 13 before JAX 0.11.
    stacked = x.reshape(n_devices, -1, x.shape[1])  # [n, k, m]
    f = jax.pmap(lambda b: lax.psum_scatter(b, "i", scatter_dimension=dim,
                                            tiled=True), axis_name="i")
    out = np.asarray(f(stacked))  # [n, k, m/n]: device d holds columns block d
    return np.concatenate(list(out), axis=1)  # [k, m]
# [end:pmap]


# [start:shard_map]
def batched_total_shard_map(x, mesh, check_vma=True):
    # x: f32[b, n*k]; vmap over the b rows of a shard_map that sums each row
    # over devices. check_vma=True raises on JAX 0.8.1 (pitfall 12).
    f = jax.shard_map(lambda row: lax.psum(row.sum(keepdims=True), "i"),
                      mesh=mesh, in_specs=P("i"), out_specs=P(),
                      check_vma=check_vma)
    return jax.vmap(f)(x)  # [b, 1]


def batched_total_fixed(x, mesh):
    # Workaround 12: check_vma=False (psum over "i" makes the P() output right).
    return batched_total_shard_map(x, mesh, check_vma=False)


def scatter_last_shard_map(x, mesh, dim=-1):
    # x: f32[n*k, m] rows over "i"; each device keeps columns block d of the
    # sum of the blocks. dim=-1 fails to compile before JAX 0.11 (pitfall 13).
    f = jax.shard_map(lambda b: lax.psum_scatter(b, "i", scatter_dimension=dim,
                                                 tiled=True),
                      mesh=mesh, in_specs=P("i"), out_specs=P(None, "i"))
    return jax.jit(f)(x)  # [k, m], columns sharded over "i"


def scatter_last_fixed(x, mesh, dim=-1):
    # Workaround 13: count the dimension from the front.
    return scatter_last_shard_map(x, mesh, dim=dim % x.ndim)
# [end:shard_map]


# [start:jit]
def batched_total_jit(x, mesh):
    f = jax.jit(lambda x: x.sum(1, keepdims=True),
                in_shardings=NamedSharding(mesh, P(None, "i")))
    return f(x)


def scatter_last_jit(x, mesh):
    n = mesh.shape["i"]
    f = jax.jit(lambda x: jnp.sum(x.reshape(n, -1, x.shape[1]), axis=0),
                in_shardings=NamedSharding(mesh, P("i")),
                out_shardings=NamedSharding(mesh, P(None, "i")))
    return f(x)
# [end:jit]


# [start:numpy]
def batched_total_numpy(x):
    return x.sum(1, keepdims=True)


def scatter_last_numpy(x, n_devices):
    return x.reshape(n_devices, -1, x.shape[1]).sum(0)
# [end:numpy]


def error_line(fn, *args, **kwargs):
    """The exception ``fn`` raises, as one short line; None when it runs."""
    try:
        jax.block_until_ready(fn(*args, **kwargs))
    except (TypeError, ValueError) as err:
        text = " ".join(str(err).split())
        return f"{type(err).__name__}: {text[:110]}"
    return None


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh((N_DEVICES,), ("i",))
    print(f"JAX {jax.__version__}")

    x = np.arange(4.0 * N_DEVICES * 2, dtype=np.float32).reshape(4, -1)  # [4, 16]
    want = batched_total_numpy(x)
    plain = error_line(batched_total_shard_map, x, mesh)
    print("12. vmap(shard_map(psum)), check_vma=True ->", plain or "runs")
    if plain is None:
        np.testing.assert_array_equal(np.asarray(batched_total_shard_map(x, mesh)),
                                      want)
    for form, got in (("check_vma=False", batched_total_fixed(x, mesh)),
                      ("jit", batched_total_jit(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    print("    check_vma=False and jit ->", np.asarray(want).ravel().tolist())

    y = np.arange(2.0 * N_DEVICES * N_DEVICES, dtype=np.float32).reshape(
        2 * N_DEVICES, N_DEVICES)  # [16, 8]
    want = scatter_last_numpy(y, N_DEVICES)
    plain = error_line(scatter_last_shard_map, y, mesh)
    print("13. psum_scatter(scatter_dimension=-1) ->", plain or "runs")
    if plain is None:
        np.testing.assert_array_equal(np.asarray(scatter_last_shard_map(y, mesh)),
                                      want)
    for form, got in (("pmap", scatter_last_pmap(y, N_DEVICES, dim=-1 % y.ndim)),
                      ("shard_map", scatter_last_fixed(y, mesh)),
                      ("jit", scatter_last_jit(y, mesh))):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    print("    scatter_dimension=-1 % ndim ->", want[0].tolist())
    print("ok: both workarounds agree with NumPy in every form on JAX "
          f"{jax.__version__}")


if __name__ == "__main__":
    main()
