"""Data-parallel training: plain SGD on averaged gradients, the same params everywhere.

What it shows: N steps of ``params -= lr * grad`` for a linear model
``y ~ x @ w + b`` whose batch is split by rows over the devices. Every step
averages the per-device gradients (and the loss) with ``pmean``, so every
device applies the same update and the parameters stay identical across
devices, bit for bit; after N steps they equal single-device training on the
whole batch. No optimiser library: an optax optimiser would slot in where
``sgd`` is, with the averaged gradients.

Which form when:
  * pmap (legacy): one copy of the parameters per device (stacked), the step
    pmapped; the copies are compared after training.
  * shard_map: the parameters enter replicated (``P()``), are marked varying
    for ``jax.grad`` and leave replicated after ``pmean``: shard_map checks
    statically that every device returns the same value.
  * jit: the global step with the batch sharded; XLA all-reduces.

Tolerance: the forms sum gradients over devices in different orders, so
they may differ in the last bits. Each step's gradient is within the
float32 rounding bound of summing its terms (2 eps per term); the learning
rate is below 2 / (largest Hessian eigenvalue), so SGD is a contraction and
step errors do not grow: after N steps the parameters differ by at most
N times one step's bound. That is the tolerance used below, against a
single-device run and the float64 NumPy run alike.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/dp_training.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
N_STEPS = 50
LR = 0.1


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def pvary(tree, axis_name):
    # Mark replicated (invariant) values as varying over axis_name.
    if hasattr(lax, "pcast"):  # JAX >= 0.8.2
        return jax.tree_util.tree_map(
            lambda p: lax.pcast(p, axis_name, to="varying"), tree)
    return jax.tree_util.tree_map(lambda p: lax.pvary(p, axis_name), tree)


def mse(params, x, y):
    # x: [b, d], y: [b, o]; params: {"w": [d, o], "b": [o]}
    residual = x @ params["w"] + params["b"][None, :] - y
    return jnp.mean(residual ** 2)


def sgd(params, grads):
    return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads)


def averaged(params, x, y, axis_name):
    # This device's loss and gradient, averaged with the others' by pmean.
    loss, grads = jax.value_and_grad(mse)(params, x, y)
    return lax.pmean((loss, grads), axis_name)


# [start:pmap]
def train_pmap(params, x, y, n_devices, n_steps=N_STEPS):
    xs = x.reshape(n_devices, -1, x.shape[1])  # [n, b/n, d]
    ys = y.reshape(n_devices, -1, y.shape[1])  # [n, b/n, o]
    # One copy of the parameters per device, updated in step by every device
    copies = jax.tree_util.tree_map(
        lambda p: np.broadcast_to(p, (n_devices, *p.shape)), params)
    def step(params, xb, yb):
        loss, grads = averaged(params, xb, yb, "i")
        return sgd(params, grads), loss

    step = jax.pmap(step, axis_name="i")
    losses = []
    for _ in range(n_steps):
        copies, loss = step(copies, xs, ys)
        losses.append(float(loss[0]))
    for c in jax.tree_util.tree_leaves(copies):
        c = np.asarray(c)
        assert (c == c[0]).all(), "parameter copies drifted apart"
    return jax.tree_util.tree_map(lambda c: np.asarray(c)[0], copies), losses
# [end:pmap]


# [start:shard_map]
def train_shard_map(params, x, y, mesh, n_steps=N_STEPS):
    def per_device(params, xb, yb):
        # params: invariant (the same everywhere); xb: [b/n, d], yb: [b/n, o].
        # Gradients at varying params are local; after pmean they are
        # invariant, and so are the updated params.
        loss, grads = averaged(pvary(params, "i"), xb, yb, "i")
        return sgd(params, grads), loss

    step = jax.jit(jax.shard_map(per_device, mesh=mesh,
                                 in_specs=(P(), P("i"), P("i")),
                                 out_specs=(P(), P())))
    losses = []
    for _ in range(n_steps):
        params, loss = step(params, x, y)
        losses.append(float(loss))
    return params, losses
# [end:shard_map]


# [start:jit]
def train_jit(params, x, y, mesh, n_steps=N_STEPS):
    def global_step(params, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        return sgd(params, grads), loss

    rows, replicated = NamedSharding(mesh, P("i")), NamedSharding(mesh, P())
    step = jax.jit(global_step, in_shardings=(replicated, rows, rows),
                   out_shardings=(replicated, replicated))
    losses = []
    for _ in range(n_steps):
        params, loss = step(params, x, y)
        losses.append(float(loss))
    return params, losses


def train_one_device(params, x, y, n_steps=N_STEPS):
    step = jax.jit(lambda p, x, y: sgd(p, jax.grad(mse)(p, x, y)))
    for _ in range(n_steps):
        params = step(params, x, y)
    return params
# [end:jit]


# [start:numpy]
def train_numpy(params, x, y, n_steps=N_STEPS):
    w, b, x, y = (np.asarray(a, np.float64) for a in (params["w"], params["b"], x, y))
    for _ in range(n_steps):
        residual = x @ w + b - y
        scale = 2.0 / residual.size
        w, b = w - LR * scale * x.T @ residual, b - LR * scale * residual.sum(0)
    return {"w": w, "b": b}


def tolerance(batch, d, n_steps=N_STEPS):
    # 2 eps per rounded term of a gradient element (a d-term residual, a
    # batch-term sum, a few scalings), times the steps (SGD is a contraction)
    terms = d + batch + 4
    return 2 * np.finfo(np.float32).eps * terms * n_steps
# [end:numpy]


def example(n_devices, rows_per_device=16, d=4, o=2, seed=0):
    rng = np.random.default_rng(seed)
    batch = n_devices * rows_per_device
    x = rng.standard_normal((batch, d)).astype(np.float32)
    w_true = rng.standard_normal((d, o))
    y = (x @ w_true + 0.5 + 0.1 * rng.standard_normal((batch, o))).astype(np.float32)
    params = {"w": np.zeros((d, o), np.float32), "b": np.zeros(o, np.float32)}
    return params, x, y


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    params, x, y = example(N_DEVICES)
    rtol = tolerance(*x.shape)
    one = train_one_device(params, x, y)
    want = train_numpy(params, x, y)
    results = {
        "pmap": train_pmap(params, x, y, N_DEVICES),
        "shard_map": train_shard_map(params, x, y, mesh),
        "jit": train_jit(params, x, y, mesh),
    }
    for form, (trained, losses) in results.items():
        for name in ("w", "b"):
            got = np.asarray(trained[name])
            np.testing.assert_allclose(got, np.asarray(one[name]), rtol=rtol,
                                       atol=rtol, err_msg=f"{name} ({form} form)")
            np.testing.assert_allclose(got, want[name], rtol=rtol, atol=rtol,
                                       err_msg=f"{name} ({form} vs NumPy)")
            if form != "pmap":  # pmap checked its copies itself
                shards = [np.asarray(s.data) for s in trained[name].addressable_shards]
                assert all((s == shards[0]).all() for s in shards), form
        assert losses[-1] < losses[0] / 10, f"{form}: the loss did not go down"
    losses = results["shard_map"][1]
    print(f"{N_STEPS} SGD steps, batch {x.shape[0]} over {N_DEVICES} devices")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"ok: every device holds the same params; pmap, shard_map and jit equal "
          f"single-device training and NumPy within rtol {rtol:.2g}")


if __name__ == "__main__":
    main()
