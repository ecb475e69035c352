"""Data-parallel training with optax.adam: averaged gradients, one update everywhere.

What it shows: N steps of ``optax.adam`` on a linear model ``y ~ x @ w + b``
whose batch is split by rows over the devices. Each step averages the
per-device loss and gradients with ``pmean``; every device applies the same
Adam update to its copy of the parameters *and* of the Adam state (the
moments m and v, replicated), so the copies stay identical and equal
single-device training on the whole batch.

The n x gradient trap, with an optimiser: in shard_map, ``jax.grad`` at
replicated (invariant) parameters already sums the gradient over devices, and
``pmean`` after it leaves n times the right gradient. Adam hides it: its
update m / (sqrt(v) + eps) does not change when every gradient is scaled by
n, so the loss curve looks right; SGD, gradient clipping or a logged gradient
norm would show it. ``main()`` prints both.

Which form when:
  * pmap (legacy, as in the pmap tour): one copy of params and Adam state per
    device, the step pmapped with ``donate_argnums``.
  * shard_map: params and state enter replicated (``P()``); params are
    marked varying for ``jax.grad``; ``pmean`` makes the gradients invariant.
  * jit: the global step with the batch sharded; XLA all-reduces.

Tolerance: each step's gradient is within float32's bound for summing its
terms (2 eps per term); Adam's update is a ratio of gradients, so its
relative error is about twice theirs while no gradient element is near zero
(true for these few small steps); the N steps' errors add up.

Requires: optax.
Registered as: ``collectives.RECIPES["dp_adam"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/optax_training.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
N_STEPS = 20
LR = 0.05
OPTIMIZER = optax.adam(LR)


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def pvary(tree, axis_name):
    # Mark replicated (invariant) values as varying over axis_name.
    if hasattr(lax, "pcast"):  # JAX >= 0.9
        return jax.tree_util.tree_map(
            lambda p: lax.pcast(p, axis_name, to="varying"), tree)
    return jax.tree_util.tree_map(lambda p: lax.pvary(p, axis_name), tree)


def mse(params, x, y):
    # x: [b, d], y: [b, o]; params: {"w": [d, o], "b": [o]}
    return jnp.mean((x @ params["w"] + params["b"][None, :] - y) ** 2)


def adam_step(params, opt_state, grads):
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


# [start:pmap]
def train_pmap(params, x, y, n_devices, n_steps=N_STEPS):
    xs = x.reshape(n_devices, -1, x.shape[1])  # [n, b/n, d]
    ys = y.reshape(n_devices, -1, y.shape[1])

    def step(params, opt_state, xb, yb):
        loss, grads = jax.value_and_grad(mse)(params, xb, yb)
        loss, grads = lax.pmean((loss, grads), "i")  # pmap: grads are local
        return (*adam_step(params, opt_state, grads), loss)

    step = jax.pmap(step, axis_name="i", donate_argnums=(0, 1))
    copies = jax.tree_util.tree_map(  # one copy per device, state included
        lambda a: np.broadcast_to(a, (n_devices, *np.shape(a))),
        (params, OPTIMIZER.init(params)))
    for _ in range(n_steps):
        *copies, _ = step(*copies, xs, ys)
    for leaf in jax.tree_util.tree_leaves(copies):
        leaf = np.asarray(leaf)
        assert (leaf == leaf[0]).all(), "device copies drifted apart"
    return jax.tree_util.tree_map(lambda c: np.asarray(c)[0], copies[0])
# [end:pmap]


# [start:shard_map]
def train_shard_map(params, x, y, mesh, n_steps=N_STEPS, trap=False):
    def per_device(params, opt_state, xb, yb):
        # params, opt_state: invariant; xb: [b/n, d]. Varying params make
        # jax.grad local; without (trap=True) it already sums over devices.
        local = params if trap else pvary(params, "i")
        loss, grads = lax.pmean(jax.value_and_grad(mse)(local, xb, yb), "i")
        return (*adam_step(params, opt_state, grads), loss)

    step = jax.jit(jax.shard_map(per_device, mesh=mesh,
                                 in_specs=(P(), P(), P("i"), P("i")),
                                 out_specs=(P(), P(), P())))
    opt_state = OPTIMIZER.init(params)
    for _ in range(n_steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params
# [end:shard_map]


# [start:jit]
def train_jit(params, x, y, mesh, n_steps=N_STEPS):
    def global_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        return (*adam_step(params, opt_state, grads), loss)

    rows, replicated = NamedSharding(mesh, P("i")), NamedSharding(mesh, P())
    step = jax.jit(global_step, in_shardings=(replicated, replicated, rows, rows),
                   out_shardings=replicated)
    opt_state = OPTIMIZER.init(params)
    for _ in range(n_steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params


def train_one_device(params, x, y, n_steps=N_STEPS):
    step = jax.jit(lambda p, s: adam_step(p, s, jax.grad(mse)(p, x, y)))
    opt_state = OPTIMIZER.init(params)
    for _ in range(n_steps):
        params, opt_state = step(params, opt_state)
    return params
# [end:jit]


# [start:numpy]
def train_numpy(params, x, y, n_steps=N_STEPS, b1=0.9, b2=0.999, eps=1e-8):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x, y = x.astype(np.float64), y.astype(np.float64)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    for t in range(1, n_steps + 1):
        residual = x @ p["w"] + p["b"] - y
        scale = 2.0 / residual.size
        grads = {"w": scale * x.T @ residual, "b": scale * residual.sum(0)}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
            p[k] = p[k] - LR * m_hat / (np.sqrt(v_hat) + eps)
    return p


def tolerance(batch, d, n_steps=N_STEPS):
    # 2 eps per rounded term of a gradient element, twice that through
    # Adam's ratio, the errors of n_steps steps added up
    return 2 * 2 * np.finfo(np.float32).eps * (d + batch + 4) * n_steps
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16 * N_DEVICES, 4)).astype(np.float32)
    y = (x @ rng.standard_normal((4, 2)) + 0.5).astype(np.float32)
    params = {"w": np.zeros((4, 2), np.float32), "b": np.zeros(2, np.float32)}
    tol = tolerance(*x.shape)
    want, one = train_numpy(params, x, y), train_one_device(params, x, y)
    results = {"pmap": train_pmap(params, x, y, N_DEVICES),
               "shard_map": train_shard_map(params, x, y, mesh),
               "jit": train_jit(params, x, y, mesh)}
    for form, trained in results.items():
        for k in ("w", "b"):
            np.testing.assert_allclose(np.asarray(trained[k]), np.asarray(one[k]),
                                       rtol=tol, atol=tol, err_msg=f"{form} {k}")
            np.testing.assert_allclose(np.asarray(trained[k]), want[k], rtol=tol,
                                       atol=tol, err_msg=f"{form} {k} vs NumPy")
    # The trap: 8x gradients, and Adam steps that barely notice.
    trapped = train_shard_map(params, x, y, mesh, trap=True)
    drift = max(float(np.max(np.abs(trapped[k] - want[k]))) for k in want)
    assert drift < 1e-4, drift
    print(f"{N_STEPS} optax.adam steps, batch {x.shape[0]} over {N_DEVICES} devices: "
          f"loss {float(mse(params, x, y)):.4f} -> {float(mse(one, x, y)):.4f}")
    print(f"n x gradient trap (grad at invariant params, then pmean): the "
          f"gradients are {N_DEVICES}x too large, yet Adam's parameters move "
          f"only {drift:.1e}: Adam is blind to the gradient's scale")
    print(f"ok: pmap, shard_map and jit equal single-device training and NumPy "
          f"within {tol:.2g}")


if __name__ == "__main__":
    main()
