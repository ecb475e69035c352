"""FSDP (ZeRO-3) training with optax: params, grads and Adam state sharded 8 ways.

What it shows: the relu MLP of JAX's distributed-arrays tutorial trained with
``optax.adam``, every parameter split on dim 0 over the "data" axis along
with the batch. Each device stores 1/8 of the parameters and 1/8 of the Adam
moments. Per layer, the weight blocks are all-gathered just before use and
dropped after; ``jax.checkpoint`` with a policy that saves only the layer's
pre-activation makes the backward pass gather them again instead of keeping
them. The transpose of an all-gather is a reduce-scatter (``psum_scatter``):
each device receives the summed gradient of its own block and updates only
that block (Adam is elementwise, so a block's update needs nothing else).

Which form when:
  * shard_map: the per-device program: gathers, remat and scatters in view.
  * jit: the global model with the parameters (and so the Adam state) placed
    ``P("data")``; a ``with_sharding_constraint`` to replicated on each weight
    asks XLA to gather it where it is used.
  * pmap (legacy): the per-device body over stacked blocks; the blocks stay
    stacked between steps.

Requires: optax.
Registered as: ``collectives.RECIPES["fsdp_mlp"]``,
``collectives.RECIPES["fsdp_tp_mlp"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/fsdp.py``
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8
SIZES, BATCH, LR, STEPS = (16, 64, 64, 64, 8), 64, 0.003, 10
OPTIMIZER = optax.adam(LR)
POLICY = jax.checkpoint_policies.save_only_these_names("z")


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("data",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def init_params(sizes, seed=0):
    rng = np.random.default_rng(seed)
    params = {}
    for k in range(1, len(sizes)):
        params[f"w{k}"] = (rng.standard_normal((sizes[k - 1], sizes[k]))
                           / np.sqrt(sizes[k - 1])).astype(np.float32)
        params[f"b{k}"] = (0.1 * rng.standard_normal(sizes[k])).astype(np.float32)
    return params


def n_layers(params):
    return len(params) // 2


# [start:shard_map]
def dense(w_block, b_block, a, last):
    # w_block: [fan_in/n, fan_out], b_block: [fan_out/n]: gathered, used, dropped
    w = lax.all_gather(w_block, "data", tiled=True)  # [fan_in, fan_out]
    b = lax.all_gather(b_block, "data", tiled=True)
    z = checkpoint_name(a @ w + b[None], "z")  # saved for relu'
    return z if last else jax.nn.relu(z)


def local_loss(blocks, x, y, batch):
    a = x  # [b/n, d_in]: this device's rows
    for k in range(1, n_layers(blocks) + 1):
        layer = jax.checkpoint(functools.partial(dense, last=k == n_layers(blocks)),
                               policy=POLICY)  # backward: gather w again
        a = layer(blocks[f"w{k}"], blocks[f"b{k}"], a)
    return jnp.sum((a - y) ** 2) / batch


def step_per_device(blocks, opt_state, x, y, batch):
    # blocks, opt_state: this device's 1/n; grads: reduce-scattered blocks
    loss, grads = jax.value_and_grad(local_loss)(blocks, x, y, batch)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, blocks)
    return optax.apply_updates(blocks, updates), opt_state, lax.psum(loss, "data")


def state_specs(opt_state):
    # Adam's moments shard like the params; its step count is replicated
    return jax.tree_util.tree_map(lambda a: P() if a.ndim == 0 else P("data"),
                                  opt_state)


def train_shard_map(params, x, y, mesh, steps=STEPS):
    opt_state = jax.jit(OPTIMIZER.init)(params)
    specs = (P("data"), state_specs(opt_state), P("data"), P("data"))
    step = jax.jit(jax.shard_map(
        functools.partial(step_per_device, batch=x.shape[0]), mesh=mesh,
        in_specs=specs, out_specs=(P("data"), specs[1], P())))
    for _ in range(steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params, opt_state
# [end:shard_map]


# [start:jit]
def train_jit(params, x, y, mesh, steps=STEPS):
    def layer(w, b, a, last):
        whole = NamedSharding(mesh, P())  # gather here, drop after
        w = lax.with_sharding_constraint(w, whole)
        b = lax.with_sharding_constraint(b, whole)
        z = checkpoint_name(a @ w + b[None], "z")
        return z if last else jax.nn.relu(z)

    def loss_fn(params, x, y):
        a = x
        for k in range(1, n_layers(params) + 1):
            step = functools.partial(layer, last=k == n_layers(params))
            a = jax.checkpoint(step, policy=POLICY)(params[f"w{k}"], params[f"b{k}"], a)
        return jnp.sum((a - y) ** 2) / x.shape[0]

    def global_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rows = NamedSharding(mesh, P("data"))
    params = jax.device_put(params, rows)  # every leaf split on dim 0
    state_shardings = jax.tree_util.tree_map(
        lambda spec: NamedSharding(mesh, spec),
        state_specs(jax.eval_shape(OPTIMIZER.init, params)))
    opt_state = jax.jit(OPTIMIZER.init, out_shardings=state_shardings)(params)
    step = jax.jit(global_step, in_shardings=(rows, state_shardings, rows, rows),
                   out_shardings=(rows, state_shardings, NamedSharding(mesh, P())))
    for _ in range(steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params, opt_state
# [end:jit]


# [start:pmap]
def train_pmap(params, x, y, n_devices, steps=STEPS):
    def split(a):  # [d0, ...] -> [n, d0/n, ...]: device i's block in row i
        return a.reshape(n_devices, -1, *a.shape[1:])

    blocks = jax.tree_util.tree_map(split, params)
    opt_state = jax.pmap(OPTIMIZER.init)(blocks)
    step = jax.pmap(functools.partial(step_per_device, batch=x.shape[0]),
                    axis_name="data")
    for _ in range(steps):
        blocks, opt_state, _ = step(blocks, opt_state, split(x), split(y))
    return jax.tree_util.tree_map(
        lambda a: np.asarray(a).reshape(-1, *a.shape[2:]), blocks)
# [end:pmap]


# [start:numpy]
def train_numpy(params, x, y, steps=STEPS, b1=0.9, b2=0.999, eps=1e-8):
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    x, y, layers = x.astype(np.float64), y.astype(np.float64), n_layers(params)
    for t in range(1, steps + 1):
        acts, zs = [x], []
        for k in range(1, layers + 1):
            zs.append(acts[-1] @ p[f"w{k}"] + p[f"b{k}"])
            acts.append(zs[-1] if k == layers else np.maximum(zs[-1], 0))
        grad, grads = 2 * (acts[-1] - y) / x.shape[0], {}
        for k in range(layers, 0, -1):
            dz = grad if k == layers else grad * (zs[k - 1] > 0)
            grads[f"w{k}"], grads[f"b{k}"] = acts[k - 1].T @ dz, dz.sum(0)
            grad = dz @ p[f"w{k}"].T
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            p[k] = p[k] - LR * (m[k] / (1 - b1 ** t)) / (
                np.sqrt(v[k] / (1 - b2 ** t)) + eps)
    return p
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((BATCH, SIZES[-1])).astype(np.float32)
    params = init_params(SIZES)
    want = train_numpy(params, x, y)
    results = {"shard_map": train_shard_map(params, x, y, mesh),
               "jit": train_jit(params, x, y, mesh)}
    for form, (trained, opt_state) in results.items():
        for k in want:
            np.testing.assert_allclose(np.asarray(trained[k]), want[k], rtol=1e-4,
                                       atol=1e-5, err_msg=f"{form} {k}")
        assert trained["w2"].sharding.spec == P("data"), form
        mu = opt_state[0].mu["w2"]
        assert mu.addressable_shards[0].data.shape[0] == SIZES[1] // N_DEVICES, form
    for k, value in train_pmap(params, x, y, N_DEVICES).items():
        np.testing.assert_allclose(value, want[k], rtol=1e-4, atol=1e-5,
                                   err_msg=f"pmap {k}")
    trained, opt_state = results["shard_map"]
    total = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves(
        (trained, opt_state)) if np.ndim(a))
    mine = sum(leaf.addressable_shards[0].data.nbytes for leaf in
               jax.tree_util.tree_leaves((trained, opt_state)) if leaf.ndim)
    assert mine * N_DEVICES == total, (mine, total)
    print(f"MLP {list(SIZES)}, batch {BATCH}, {STEPS} optax.adam steps, "
          f"{N_DEVICES}-way FSDP")
    print(f"params + Adam moments: {total} bytes in all, {mine} bytes per device "
          f"(1/{N_DEVICES})")
    print("ok: shard_map, jit and pmap FSDP training equal NumPy Adam; params "
          "and optimiser state stay sharded")


if __name__ == "__main__":
    main()
