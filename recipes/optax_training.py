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
    device; the body runs without ``pvary`` (pmap has no varying types).
  * shard_map: params and state enter replicated (``P()``); params are
    marked varying for ``jax.grad``; ``pmean`` makes the gradients invariant.
  * jit: the global step with the batch sharded; XLA all-reduces.
  * explicit: the same global step on Explicit mesh axes: the batch is typed
    ``float32[128@i,4]``, the parameters ``float32[4,2]`` (replicated), and
    the gradient of a replicated parameter is replicated too, so the sum
    over ``i`` happens where the types meet, one all-reduce per step.
    Accumulating microbatches, that is one all-reduce per microbatch
    (``train_microbatches_program``); parameters resharded to ``reduced``
    over ``i`` get ``unreduced`` gradients instead, which add up on each
    device and one ``reshard`` sums: one all-reduce a step whatever the
    number of microbatches (``train_deferred_program``; with two, half the
    bytes; ``collectives.RECIPES["dp_adam"]``'s explicit form; JAX >= 0.9.1).

The per-device bodies, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["dp_adam"]`` runs (with its own ``n_steps`` and
``lr``): ``axis`` may be one mesh axis name or a tuple of them.

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

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DEFERRED_SUM_SINCE = (0, 9, 1)  # summing unreduced gradients: refused before
N_DEVICES = 8
N_STEPS = 20
LR = 0.05
AXIS = "i"


def make_explicit_mesh(n_devices):
    # jax.make_mesh's default from JAX 0.9 on, spelled out for every version.
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Explicit,))


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def pvary(tree, axis):
    # Mark replicated (invariant) values as varying over axis.
    if hasattr(lax, "pcast"):  # JAX >= 0.8.2
        return jax.tree_util.tree_map(lambda p: lax.pcast(p, axis, to="varying"),
                                      tree)
    return jax.tree_util.tree_map(lambda p: lax.pvary(p, axis), tree)


def mse(params, x, y):
    # x: [b, d], y: [b, o]; params: {"w": [d, o], "b": [o]}
    return jnp.mean((x @ params["w"] + params["b"][None, :] - y) ** 2)


# [start:body]
def adam_step_per_device(params, opt_state, x, y, optimizer, axis=AXIS, vary=True):
    # params, opt_state: replicated; x: [k, d], y: [k, o] on each device.
    # vary=True (shard_map): varying params make jax.grad local, and pmean
    # averages. vary=False: pmap, which has no varying types; under shard_map
    # it is the trap, jax.grad already sums over devices and pmean keeps n x.
    local = pvary(params, axis) if vary else params
    loss, grads = lax.pmean(jax.value_and_grad(mse)(local, x, y), axis)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def train_per_device(params, x, y, axis=AXIS, n_steps=N_STEPS, lr=LR, vary=True):
    # n_steps Adam steps from a fresh state, as one lax.scan:
    # -> (losses [n_steps], the loss before each step; params), replicated
    optimizer = optax.adam(lr)

    def step(carry, _):
        loss, params, opt_state = adam_step_per_device(
            *carry, x, y, optimizer, axis, vary)
        return (params, opt_state), loss

    start = (params, optimizer.init(params))
    (params, _), losses = lax.scan(step, start, None, length=n_steps)
    return losses, params
# [end:body]


def first_copy(tree):
    # pmap returns one copy per device: check they agree, keep the first
    for leaf in jax.tree_util.tree_leaves(tree):
        leaf = np.asarray(leaf)
        assert (leaf == leaf[0]).all(), "device copies drifted apart"
    return jax.tree_util.tree_map(lambda c: np.asarray(c)[0], tree)


# [start:pmap]
def train_pmap(params, x, y, n_devices, n_steps=N_STEPS):
    xs = x.reshape(n_devices, -1, x.shape[1])  # [n, b/n, d]
    ys = y.reshape(n_devices, -1, y.shape[1])
    # one copy of params and Adam state per device; pmap: grads are local
    train = functools.partial(train_per_device, n_steps=n_steps, vary=False)
    return first_copy(jax.pmap(train, axis_name=AXIS, in_axes=(None, 0, 0))(
        params, xs, ys))
# [end:pmap]


# [start:shard_map]
def train_shard_map(params, x, y, mesh, n_steps=N_STEPS, vary=True):
    # params (and the Adam state inside) replicated, P(); rows of x, y split
    train = functools.partial(train_per_device, n_steps=n_steps, vary=vary)
    f = jax.shard_map(train, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS)),
                      out_specs=(P(), P()))
    return jax.jit(f)(params, x, y)
# [end:shard_map]


# [start:jit]
def train_program(params, x, y, n_steps=N_STEPS, lr=LR):
    # The global loop: with x, y sharded, jit all-reduces each step's gradient
    optimizer = optax.adam(lr)

    def step(carry, _):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    start = (params, optimizer.init(params))
    (params, _), losses = lax.scan(step, start, None, length=n_steps)
    return losses, params


def train_jit(params, x, y, mesh, n_steps=N_STEPS):
    rows, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())
    f = jax.jit(functools.partial(train_program, n_steps=n_steps),
                in_shardings=(replicated, rows, rows), out_shardings=replicated)
    return f(params, x, y)


def train_one_device(params, x, y, n_steps=N_STEPS):
    return jax.jit(functools.partial(train_program, n_steps=n_steps))(params, x, y)
# [end:jit]


# [start:microbatches]
def microbatches(a, m):
    # a: f32[b@data, ...] -> m microbatches f32[b/m@data, ...]: microbatch k
    # holds rows k*c .. (k+1)*c - 1 of every device's block of c*m rows, so
    # the split moves nothing. out_sharding keeps the rows on the axis (a
    # reshape may move the split off a dimension of size 1)
    split = jax.typeof(a).sharding
    entry = split.spec[0]  # the rows' axis (or axes)
    n = int(np.prod([split.mesh.shape[name] for name in
                     (entry if isinstance(entry, tuple) else (entry,))]))
    blocks = jnp.reshape(a, (n, m, -1, *a.shape[1:]),
                         out_sharding=P(entry))  # f32[n@data, m, c, ...]
    return [jnp.reshape(blocks[:, k], (-1, *a.shape[1:]), out_sharding=P(entry))
            for k in range(m)]
# [end:microbatches]


# [start:explicit]
def train_explicit_program(params, x, y, n_steps=N_STEPS, lr=LR):
    # x, y: f32[b@i, ...], params replicated: the jit form's global step,
    # unchanged; the gradient of a replicated parameter is replicated, so
    # jax.grad sums it over i: one all-reduce per step, as in the jit form
    return train_program(params, x, y, n_steps=n_steps, lr=lr)


def train_explicit(params, x, y, n_devices, n_steps=N_STEPS):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        # the layout in the types: params float32[4,2], x float32[128@i,4]
        params = jax.device_put(params, P())
        x, y = jax.device_put(x, P(AXIS)), jax.device_put(y, P(AXIS))
        losses, trained = jax.jit(functools.partial(train_explicit_program,
                                                    n_steps=n_steps))(params, x, y)
        return losses, jax.tree_util.tree_map(np.asarray, trained)


def adam_loop(value_and_grad, params, n_steps, lr):
    # n_steps Adam steps of value_and_grad(params) -> (loss, grads), as
    # train_program's loop -> (losses [n_steps], params)
    optimizer = optax.adam(lr)

    def step(carry, _):
        params, opt_state = carry
        loss, grads = value_and_grad(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    start = (params, optimizer.init(params))
    (params, _), losses = lax.scan(step, start, None, length=n_steps)
    return losses, params


def train_microbatches_program(params, x, y, n_steps=N_STEPS, lr=LR, n_micro=2):
    # Each step accumulates n_micro microbatches' gradients; each is
    # replicated, so summed over the rows' axis as it is taken: n_micro
    # all-reduces a step (XLA may combine them into one of n_micro
    # gradients' size)
    xs, ys = microbatches(x, n_micro), microbatches(y, n_micro)

    def value_and_grad(params):
        taken = [jax.value_and_grad(mse)(params, xk, yk)
                 for xk, yk in zip(xs, ys, strict=True)]
        return jax.tree_util.tree_map(lambda *v: sum(v) / n_micro, *taken)

    return adam_loop(value_and_grad, params, n_steps, lr)


def train_deferred_program(params, x, y, n_steps=N_STEPS, lr=LR, n_micro=2):
    # The same with the sum deferred: each step reshards params to
    # "reduced" over the rows' axis (w: f32[4,2]{R:i}), so each
    # microbatch's gradient comes back unreduced (f32[4,2]{U:i}: this
    # device's rows' share); the shares add up with no communication and
    # one reshard to P() sums them: one all-reduce a step, whatever n_micro.
    # The loss's per-row terms (f32[b/m@i]) are added up the same way.
    entry = jax.typeof(x).sharding.spec[0]  # the rows' axis (or axes)
    rows = set(entry if isinstance(entry, tuple) else (entry,))
    xs, ys = microbatches(x, n_micro), microbatches(y, n_micro)
    size = y.size  # the whole batch's: the shares add up to the mean

    def loss_terms(params, x, y):
        # mse with params reduced over the rows' axis: JAX adds no reduced
        # value to a sharded one, so the bias, broadcast to every row, is
        # resharded to the rows' split first
        bias = jax.sharding.reshard(jnp.broadcast_to(params["b"], y.shape), P(entry))
        terms = jnp.sum((x @ params["w"] + bias - y) ** 2, axis=1) / size
        return jnp.sum(terms), terms  # f32[b/m@i]

    def value_and_grad(params):
        held = jax.tree_util.tree_map(
            lambda p: jax.sharding.reshard(p, P(reduced=rows)), params)
        shares, terms = [], []
        for xk, yk in zip(xs, ys, strict=True):
            share, per_row = jax.grad(loss_terms, has_aux=True)(held, xk, yk)
            shares.append(share)  # {"w": f32[4,2]{U:i}, "b": f32[2]{U:i}}
            terms.append(per_row)
        # unreduced values add only to each other (sum() would start from 0)
        total = jax.tree_util.tree_map(lambda *g: functools.reduce(jnp.add, g),
                                       *shares)  # still {U:i}: no communication
        grads = jax.tree_util.tree_map(lambda g: jax.sharding.reshard(g, P()), total)
        return jnp.sum(functools.reduce(jnp.add, terms)), grads

    return adam_loop(value_and_grad, params, n_steps, lr)


def train_deferred_explicit(params, x, y, n_devices, n_steps=N_STEPS, n_micro=2):
    mesh = make_explicit_mesh(n_devices)
    with jax.set_mesh(mesh):
        params = jax.device_put(params, P())
        x, y = jax.device_put(x, P(AXIS)), jax.device_put(y, P(AXIS))
        losses, trained = jax.jit(functools.partial(
            train_deferred_program, n_steps=n_steps, n_micro=n_micro))(params, x, y)
        return losses, jax.tree_util.tree_map(np.asarray, trained)
# [end:explicit]


# [start:numpy]
def train_numpy(params, x, y, n_steps=N_STEPS, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
    # Adam by hand in float64 (b1, b2, eps: optax.adam's defaults), rounded
    # once to x's dtype at the end -> (losses [n_steps], params)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    losses = []
    for t in range(1, n_steps + 1):
        residual = x64 @ p["w"] + p["b"] - y64
        losses.append(np.mean(residual ** 2))
        scale = 2.0 / residual.size
        grads = {"w": scale * x64.T @ residual, "b": scale * residual.sum(0)}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
            p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return (np.asarray(losses).astype(x.dtype),
            {k: value.astype(x.dtype) for k, value in p.items()})


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
               "jit": train_jit(params, x, y, mesh),
               "explicit": train_explicit(params, x, y, N_DEVICES)}
    if jax.__version_info__[:3] >= DEFERRED_SUM_SINCE:
        results["explicit, 2 microbatches, one deferred sum"] = (
            train_deferred_explicit(params, x, y, N_DEVICES))
    else:
        print(f"(the deferred sum needs JAX >= 0.9.1; this is {jax.__version__}: "
              "a reduce_sum of an unreduced value is refused there)")
    for form, (losses, trained) in results.items():
        for got, ref, what in ((losses, one[0], "losses"), (losses, want[0], "losses"),
                               *((trained[k], one[1][k], k) for k in ("w", "b")),
                               *((trained[k], want[1][k], k) for k in ("w", "b"))):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=tol,
                                       atol=tol, err_msg=f"{form} {what}")
    # The trap: 8x gradients, and Adam steps that barely notice.
    _, trapped = train_shard_map(params, x, y, mesh, vary=False)
    drift = max(float(np.max(np.abs(trapped[k] - want[1][k]))) for k in ("w", "b"))
    assert drift < 1e-4, drift
    losses = want[0]
    print(f"{N_STEPS} optax.adam steps (lr {LR}), batch {x.shape[0]} over "
          f"{N_DEVICES} devices, from w = 0, b = 0")
    print(f"loss before step 1: {losses[0]:.4f} (= mean(y ** 2) = "
          f"{float(np.mean(y.astype(np.float64) ** 2)):.4f}, as w and b are 0)")
    print(f"loss before step {N_STEPS}: {losses[-1]:.4f}; b after: "
          f"{[round(float(v), 3) for v in results['shard_map'][1]['b']]} (each "
          f"Adam step moves b by about lr = {LR}: at most {N_STEPS * LR:.2f})")
    print(f"n x gradient trap (grad at invariant params, then pmean): the "
          f"gradients are {N_DEVICES}x too large, yet Adam's parameters move "
          f"only {drift:.1e}: Adam is blind to the gradient's scale")
    print(f"ok: pmap, shard_map, jit and explicit (one batch; two microbatches a "
          f"step, summed once) equal single-device training and NumPy within "
          f"{tol:.2g}")


if __name__ == "__main__":
    main()
