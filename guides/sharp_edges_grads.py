"""Sharp edge: data-parallel gradients n times too large after a pmap port.

What it shows (pitfall 3): the pmap idiom "gradient inside the body, then
``pmean``" ported literally to shard_map, with the parameters replicated
(``in_specs=P()``) and ``check_vma=True`` (the default), returns gradients
**n times too large**, without any error. Inside shard_map the replicated
parameters are *invariant*; using them with per-device data inserts an
implicit cast to *varying*, whose transpose under ``jax.grad`` is a ``psum``.
So ``jax.grad`` already returns the sum over devices, and the ``pmean`` of
that sum is the sum: n times the mean.

Fixes (each agrees with NumPy below):
  * differentiate the whole data-parallel program:
    ``jax.grad(shard_map(lambda w, x, y: pmean(loss(w, x, y))))``;
  * or mark the parameters varying first (``lax.pcast(w, "i",
    to="varying")``, ``lax.pvary`` on JAX 0.8.0 and 0.8.1), so ``jax.grad`` is local and
    the ``pmean`` averages;
  * or the jit form: ``jax.grad`` of the global loss on sharded data.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0 (the wrong factor is the same on all).
Run: ``python guides/sharp_edges_grads.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def pvary(x, axis_name):
    # Mark an invariant value as varying; spelled differently across versions.
    if hasattr(lax, "pcast"):  # JAX >= 0.8.2
        return lax.pcast(x, axis_name, to="varying")
    return lax.pvary(x, axis_name)  # JAX 0.8.0, 0.8.1


def loss(w, x, y):
    # mean squared error of a linear model: w: [d], x: [b, d], y: [b]
    return jnp.mean((x @ w - y) ** 2)


# [start:pmap]
def grads_pmap(w, x, y, n_devices):
    # The legacy idiom, correct under pmap: local gradient, then pmean.
    xs = x.reshape(n_devices, -1, x.shape[1])  # [n, b/n, d]
    ys = y.reshape(n_devices, -1)              # [n, b/n]
    f = jax.pmap(lambda w, xb, yb: lax.pmean(jax.grad(loss)(w, xb, yb), "i"),
                 axis_name="i", in_axes=(None, 0, 0))
    return np.asarray(f(w, xs, ys))[0]
# [end:pmap]


# [start:shard_map]
def grads_literal_port(w, x, y, mesh):
    # WRONG: the pmap body as is. grad(loss) already sums over devices (the
    # implicit invariant->varying cast of w transposes to a psum), so this
    # returns n times the mean gradient.
    def per_device(w, xb, yb):
        # w: [d] the same on every device; xb: [b/n, d], yb: [b/n]
        return lax.pmean(jax.grad(loss)(w, xb, yb), "i")

    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                      out_specs=P())
    return jax.jit(f)(w, x, y)


def grads_of_shard_map(w, x, y, mesh):
    # Fix A: differentiate the data-parallel loss; JAX places the psum.
    def per_device(w, xb, yb):
        return lax.pmean(loss(w, xb, yb), "i")

    mean_loss = jax.shard_map(per_device, mesh=mesh,
                              in_specs=(P(), P("i"), P("i")), out_specs=P())
    return jax.jit(jax.grad(mean_loss))(w, x, y)


def grads_pvary(w, x, y, mesh):
    # Fix B: make w varying first; grad is then local and pmean averages.
    def per_device(w, xb, yb):
        return lax.pmean(jax.grad(loss)(pvary(w, "i"), xb, yb), "i")

    f = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P("i"), P("i")),
                      out_specs=P())
    return jax.jit(f)(w, x, y)
# [end:shard_map]


# [start:jit]
def grads_jit(w, x, y, mesh):
    # The global program: grad of the mean loss over all rows.
    rows = NamedSharding(mesh, P("i"))
    f = jax.jit(jax.grad(loss), in_shardings=(NamedSharding(mesh, P()), rows, rows),
                out_shardings=NamedSharding(mesh, P()))
    return f(w, x, y)
# [end:jit]


# [start:numpy]
def grads_numpy(w, x, y):
    # d/dw mean((x w - y)^2) = 2/b x^T (x w - y)
    x, y, w = (a.astype(np.float64) for a in (x, y, w))
    return 2.0 / x.shape[0] * x.T @ (x @ w - y)
# [end:numpy]


def example(n_devices, rows_per_device=2, d=3):
    # Small integers: every gradient below is exact in float32.
    rng = np.random.default_rng(0)
    b = n_devices * rows_per_device
    x = rng.integers(-2, 3, size=(b, d)).astype(np.float32)
    y = rng.integers(-2, 3, size=(b,)).astype(np.float32)
    w = np.array([1.0, -1.0, 0.5], np.float32)[:d]
    return w, x, y


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    w, x, y = example(N_DEVICES)
    want = grads_numpy(w, x, y)
    wrong = np.asarray(grads_literal_port(w, x, y, mesh))
    np.testing.assert_allclose(wrong, N_DEVICES * want, rtol=1e-6)
    for form, got in (("pmap", grads_pmap(w, x, y, N_DEVICES)),
                      ("grad of shard_map", grads_of_shard_map(w, x, y, mesh)),
                      ("shard_map with pvary", grads_pvary(w, x, y, mesh)),
                      ("jit", grads_jit(w, x, y, mesh))):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6,
                                   err_msg=f"gradient ({form} form)")
    print(f"JAX {jax.__version__}")
    print("NumPy gradient:            ", want.tolist())
    print("literal pmap->shard_map port:", wrong.tolist(),
          f"({N_DEVICES}x too large)")
    print("ok: pmap, grad-of-shard_map, pvary and jit gradients agree with NumPy")


if __name__ == "__main__":
    main()
