"""FSDP (ZeRO-3) training with optax: params, grads and Adam state sharded 8 ways.

What it shows: the relu MLP of JAX's distributed-arrays tutorial trained with
``optax.adam``, every parameter split on dim 0 over the "data" axis along
with the batch. Each device stores 1/8 of the parameters and 1/8 of the Adam
moments. Per layer, the weight and bias blocks are flattened into one buffer
and all-gathered (one collective per layer) just before use, and dropped
after; ``jax.checkpoint`` with a policy that saves only the layer's
pre-activation makes the backward pass gather them again instead of keeping
them (layer 1 excepted: no gradient flows into x). The transpose of an
all-gather is a reduce-scatter (``psum_scatter``): each device receives the
summed gradient of its own block and updates only that block (Adam is
elementwise, so a block's update needs nothing else).

FSDP x TP: on a mesh with a "model" axis too, the Megatron layout of
``dp_tp_mlp.py`` on both layer pairs (W1 and W3 split by columns, W2 and W4
by rows over "model"; b1 and b3 split like their weights' columns, b2 and
b4 not) with each block also split over "data" on its other dimension
(``w1: P(data, model)``, ``b1: P((model, data))``, ``w2: P(model, data)``,
``b2: P(data)``, and the same for layers 3 and 4). The sums over "model" are
Megatron's f (before W3: identity forward, a sum of the gradient backward;
before W1 it has nothing to sum, as no gradient flows into x) and g (after
W2 and W4: a sum forward, identity backward), ``custom_vjp`` functions that
fix the backward sum by hand, so the same body is right under shard_map
with ``check_vma=False`` and under pmap, where the model axis is
``vmap``ped.

Which form when:
  * shard_map: the per-device program: gathers, remat and scatters in view.
  * jit: the global model with the parameters (and so the Adam state) placed
    ``P("data")``; a ``with_sharding_constraint`` on each weight to its
    layout as used (replicated, or its Megatron blocks over "model") asks
    XLA to gather it where it is used.
  * explicit: the same global model on Explicit axes, the parameters typed
    ``P("data")``: ``reshard`` to each weight's layout as used is the
    gather, its transpose the gradient's way back; ``out_sharding=`` on each
    product (W2's and W4's contractions over "model" need one).
    Accumulating microbatches the FSDP way gathers every weight and
    reduce-scatters every gradient per microbatch
    (``value_and_grad_microbatches_explicit_program``). Deferred
    (``value_and_grad_deferred_explicit_program``,
    ``collectives.RECIPES["fsdp_mlp"]``'s explicit form; JAX >= 0.9.1):
    each weight is gathered once, typed ``reduced`` over "data", its
    ``unreduced`` gradient shares add up on each device, and one
    ``reshard`` to ``P("data")`` reduce-scatters the total: half the
    gradient bytes for two microbatches, one gather of each block, for
    whole weights and gradients held through the step (PyTorch FSDP's
    ``no_sync``).
  * pmap (legacy): the per-device body over stacked blocks; the blocks stay
    stacked between steps.

The per-device body, the global program and the NumPy oracle of the loss and
gradients below are the ones ``collectives.RECIPES["fsdp_mlp"]`` and
``["fsdp_tp_mlp"]`` run: the data axis may be one mesh axis name or a tuple
of them. They need only jax; optax is for the training loops.

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
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

try:
    import optax  # the training loops (train_*) only
except ImportError:  # the loss and gradients need only jax
    optax = None

DEFERRED_SUM_SINCE = (0, 9, 1)  # summing unreduced gradients: refused before
N_DEVICES = 8
SIZES, BATCH, LR, STEPS = (16, 64, 64, 64, 8), 64, 0.003, 10
DATA, MODEL = "data", "model"
N_LAYERS = 4
PARAM_NAMES = tuple(f"{kind}{k}" for k in range(1, N_LAYERS + 1) for kind in "wb")
SAVED = "fsdp_preactivation"  # the checkpoint_name of z = a @ w + b
# Save only each layer's pre-activation (for relu's mask), so the backward
# pass gathers the weights again. (save_anything_except_these_names on the
# gathered weights is not enough: the values they are computed from, one
# reshape earlier, would be saved instead.)
POLICY = jax.checkpoint_policies.save_only_these_names(SAVED)


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def init_params(sizes, seed=0):
    rng = np.random.default_rng(seed)
    params = {}
    for k in range(1, len(sizes)):
        params[f"w{k}"] = (rng.standard_normal((sizes[k - 1], sizes[k]))
                           / np.sqrt(sizes[k - 1])).astype(np.float32)
        params[f"b{k}"] = (0.1 * rng.standard_normal(sizes[k])).astype(np.float32)
    return params


def names(axis):
    return (axis,) if isinstance(axis, str) else tuple(axis)


def fsdp_specs(data_axis=DATA, model_axis=None):
    # every parameter split on dim 0 over data_axis; with model_axis, the
    # Megatron blocks of used_specs split over data_axis on their other
    # dimension (b1, b3: each model block over data_axis)
    specs = {name: P(data_axis) for name in PARAM_NAMES}
    if model_axis is not None:
        columns, bias = P(data_axis, model_axis), P((model_axis, *names(data_axis)))
        rows = P(model_axis, data_axis)
        specs.update(w1=columns, b1=bias, w2=rows, w3=columns, b3=bias, w4=rows)
    return specs


def used_specs(model_axis=None):
    # each parameter as a layer uses it: whole, or with model_axis Megatron's
    # blocks on both layer pairs: W1, b1 and W3, b3 split by columns, W2 and
    # W4 by rows, b2 and b4 whole
    specs = {name: P() for name in PARAM_NAMES}
    if model_axis is not None:
        specs.update(w1=P(None, model_axis), b1=P(model_axis), w2=P(model_axis),
                     w3=P(None, model_axis), b3=P(model_axis), w4=P(model_axis))
    return specs


# [start:body]
@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def model_identity_psum_grad(a, model_axis):
    # Megatron's f: identity forward, psum over model_axis backward. Put it
    # where a value replicated over model_axis meets model-split weights.
    return a


model_identity_psum_grad.defvjp(lambda a, axis: (a, None),
                                lambda axis, _, g: (lax.psum(g, axis),))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def model_psum_identity_grad(a, model_axis):
    # Megatron's g: psum over model_axis forward (partial sums after the
    # row-split matmul), identity backward
    return lax.psum(a, model_axis)


model_psum_identity_grad.defvjp(lambda a, axis: (lax.psum(a, axis), None),
                                lambda axis, _, g: (g,))


def gather_layer(w_block, b_block, axis=DATA, w_dim=0, one_axis_at_a_time=False):
    # w_block: this device's block of w, split on w_dim over axis (a name or a
    # tuple); b_block: [fan_out/n]. One buffer, one all-gather (its
    # transpose, the backward pass: one psum_scatter) -> whole w and b.
    # one_axis_at_a_time: gather a tuple of axes innermost first (under pmap,
    # vmapped axes gather one by one).
    w_moved = jnp.moveaxis(w_block, w_dim, 0)
    flat = jnp.concatenate([w_moved.reshape(-1), b_block.reshape(-1)])
    gathered = flat
    for name in reversed(names(axis)) if one_axis_at_a_time else [axis]:
        gathered = lax.all_gather(gathered, name, tiled=True)
    n = gathered.shape[0] // flat.shape[0]
    chunks = gathered.reshape(n, flat.shape[0])  # device i's buffer in row i
    w = chunks[:, :w_moved.size].reshape(n * w_moved.shape[0], *w_moved.shape[1:])
    b = chunks[:, w_moved.size:].reshape(n * b_block.shape[0], *b_block.shape[1:])
    return jnp.moveaxis(w, 0, w_dim), b


def value_and_grad_per_device(blocks, x, y, data_axis=DATA, model_axis=None,
                              one_axis_at_a_time=False):
    # blocks: this device's block of every parameter, as fsdp_specs splits
    # them; x: [b, d_in], y: [b, d_out] this device's rows
    batch = x.shape[0] * lax.axis_size(data_axis)  # rows on all devices

    def dense(w_block, b_block, a, layer):
        # with model_axis, Megatron's pairs (W1, W2) and (W3, W4): W1 and W3
        # split by columns, W2 and W4 by rows (their data blocks on dim 1)
        by_rows = model_axis is not None and layer % 2 == 0
        w, b = gather_layer(w_block, b_block, data_axis, int(by_rows),
                            one_axis_at_a_time)
        if model_axis is not None and not by_rows:  # f: whole a meets model
            a = model_identity_psum_grad(a, model_axis)  # columns (x: no grad)
        z = a @ w
        if by_rows:  # g: partial sums over the split input dimension
            z = model_psum_identity_grad(z, model_axis)
        z = checkpoint_name(z + b[None], SAVED)  # saved for relu's mask
        return z if layer == N_LAYERS else jax.nn.relu(z)

    def local_loss(p):
        a = x  # [b, d_in]; then [b, h1 (/t)], [b, h2], [b, h3 (/t)], [b, d_out]
        for layer in range(1, N_LAYERS + 1):
            step = jax.checkpoint(functools.partial(dense, layer=layer),
                                  policy=POLICY)  # backward: gather w again
            a = step(p[f"w{layer}"], p[f"b{layer}"], a)
        return jnp.sum((a - y) ** 2) / batch

    # grads: the reduce-scattered blocks, laid out like `blocks`
    local, grads = jax.value_and_grad(local_loss)(blocks)
    return lax.psum(local, data_axis), grads  # the loss: the same everywhere
# [end:body]


def state_specs(opt_state, data_axis=DATA):
    # Adam's moments shard like the params; its step count is replicated
    return jax.tree_util.tree_map(lambda a: P() if a.ndim == 0 else P(data_axis),
                                  opt_state)


def step_per_device(blocks, opt_state, x, y, optimizer):
    # blocks, opt_state: this device's 1/n; Adam updates each block alone
    loss, grads = value_and_grad_per_device(blocks, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, blocks)
    return optax.apply_updates(blocks, updates), opt_state, loss


# [start:shard_map]
def value_and_grad_shard_map(mesh, model_axis=None):
    specs = fsdp_specs(DATA, model_axis)
    body = functools.partial(value_and_grad_per_device, model_axis=model_axis)
    # check_vma=False with a model axis: f and g fix their backward sums
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P(DATA), P(DATA)),
                                 out_specs=(P(), specs),
                                 check_vma=model_axis is None))


def train_shard_map(params, x, y, mesh, steps=STEPS):
    optimizer = optax.adam(LR)
    opt_state = jax.jit(optimizer.init)(params)
    specs = (P(DATA), state_specs(opt_state), P(DATA), P(DATA))
    step = jax.jit(jax.shard_map(
        functools.partial(step_per_device, optimizer=optimizer), mesh=mesh,
        in_specs=specs, out_specs=(P(DATA), specs[1], P())))
    for _ in range(steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params, opt_state
# [end:shard_map]


# [start:jit]
def value_and_grad_program(params, x, y, mesh, data_axis=DATA, model_axis=None):
    # the global model: each layer's weights constrained to their layout as
    # used just before use (under the same remat policy), the batch rows
    # over data_axis
    used = used_specs(model_axis)

    def constrain(a, spec):
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    def dense(w, b, a, layer):
        w = constrain(w, used[f"w{layer}"])  # gather here, drop after
        b = constrain(b, used[f"b{layer}"])
        columns = model_axis if layer % 2 == 1 else None  # W1's, W3's columns
        z = constrain(a @ w + b[None], P(data_axis, columns))
        z = checkpoint_name(z, SAVED)
        return z if layer == N_LAYERS else jax.nn.relu(z)

    def loss(p):
        a = x
        for layer in range(1, N_LAYERS + 1):
            step = jax.checkpoint(functools.partial(dense, layer=layer),
                                  policy=POLICY)
            a = step(p[f"w{layer}"], p[f"b{layer}"], a)
        return jnp.sum((a - y) ** 2) / x.shape[0]

    return jax.value_and_grad(loss)(params)


def value_and_grad_jit(mesh, model_axis=None):
    def place(spec):
        return NamedSharding(mesh, spec)

    shardings = jax.tree_util.tree_map(place, fsdp_specs(DATA, model_axis))
    program = functools.partial(value_and_grad_program, mesh=mesh,
                                model_axis=model_axis)
    return jax.jit(program, in_shardings=(shardings, place(P(DATA)), place(P(DATA))),
                   out_shardings=(place(P()), shardings))


def train_jit(params, x, y, mesh, steps=STEPS):
    optimizer = optax.adam(LR)

    def global_step(params, opt_state, x, y):
        loss, grads = value_and_grad_program(params, x, y, mesh)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rows = NamedSharding(mesh, P(DATA))
    params = jax.device_put(params, rows)  # every leaf split on dim 0
    state_shardings = jax.tree_util.tree_map(
        lambda spec: NamedSharding(mesh, spec),
        state_specs(jax.eval_shape(optimizer.init, params)))
    opt_state = jax.jit(optimizer.init, out_shardings=state_shardings)(params)
    step = jax.jit(global_step, in_shardings=(rows, state_shardings, rows, rows),
                   out_shardings=(rows, state_shardings, NamedSharding(mesh, P())))
    for _ in range(steps):
        params, opt_state, _ = step(params, opt_state, x, y)
    return params, opt_state
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
def value_and_grad_explicit_program(params, x, y, data_axis=DATA, model_axis=None):
    # The global model on Explicit axes: params typed as stored (w1:
    # f32[h0@data, h1]); reshard to the layout as used is the gather (under
    # the remat policy, again in the backward pass), and its transpose
    # brings each gradient back to the stored layout, summed over data_axis.
    # out_sharding names each product's layout: w2 and w4 contract a
    # dimension split over model_axis (the sum over it).
    used = used_specs(model_axis)

    def dense(w, b, a, layer):
        w = jax.sharding.reshard(w, used[f"w{layer}"])  # gather here, drop after
        b = jax.sharding.reshard(b, used[f"b{layer}"])
        columns = model_axis if layer % 2 == 1 else None  # W1's, W3's columns
        z = jnp.matmul(a, w, out_sharding=P(data_axis, columns)) + b[None]
        z = checkpoint_name(z, SAVED)  # f32[b@data, h] (h1, h3 @model)
        return z if layer == N_LAYERS else jax.nn.relu(z)

    def loss(p):
        a = x
        for layer in range(1, N_LAYERS + 1):
            step = jax.checkpoint(functools.partial(dense, layer=layer),
                                  policy=POLICY)
            a = step(p[f"w{layer}"], p[f"b{layer}"], a)
        return jnp.sum((a - y) ** 2) / x.shape[0]

    # grads: typed like params (f32[h0@data, h1]: each device's rows only)
    return jax.value_and_grad(loss)(params)


def value_and_grad_explicit(mesh, model_axis=None):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    specs = fsdp_specs(DATA, model_axis)
    program = jax.jit(functools.partial(value_and_grad_explicit_program,
                                        model_axis=model_axis))

    def run(params, x, y):
        with jax.set_mesh(mesh):
            params = jax.sharding.reshard(params, specs)
            x, y = jax.sharding.reshard((x, y), P(DATA))
            return program(params, x, y)

    return run


def value_and_grad_microbatches_explicit_program(params, x, y, data_axis=DATA,
                                                 model_axis=None, n_micro=2):
    # Gradient accumulation over n_micro microbatches, the FSDP way: each
    # microbatch gathers every weight (forward, and again backward) and
    # reduce-scatters its gradient to the stored layout: n_micro of each
    xs, ys = microbatches(x, n_micro), microbatches(y, n_micro)
    taken = [value_and_grad_explicit_program(params, xk, yk, data_axis, model_axis)
             for xk, yk in zip(xs, ys, strict=True)]
    return jax.tree_util.tree_map(lambda *v: sum(v) / n_micro, *taken)


def value_and_grad_deferred_explicit_program(params, x, y, data_axis=DATA,
                                             model_axis=None, n_micro=2):
    # The same with the reduce-scatter deferred across the microbatches:
    # each weight is gathered once, to its layout as used, typed reduced
    # over data_axis (w2: f32[h1@model, h2]{R:data}), so each microbatch's
    # gradient comes back unreduced (f32[h1@model, h2]{U:data}: this
    # device's rows' share of the whole weight's gradient). The shares add
    # up with no communication; one reshard to the stored layout (w2:
    # P(model, data)) reduce-scatters the total: one gather and one
    # reduce-scatter per parameter for all n_micro microbatches. The price
    # is memory: for the step every device holds whole weights (of its
    # model block) and their whole gradient shares, as data parallelism
    # does (PyTorch FSDP's no_sync); between steps, parameters and Adam
    # state stay sharded.
    data = set(names(data_axis))
    batch = x.shape[0]  # the whole batch's rows: the shares add up to the mean
    used = used_specs(model_axis)
    held = {k: jax.sharding.reshard(v, P(*used[k], reduced=data))  # the gathers
            for k, v in params.items()}

    def loss_terms(p, x, y):
        # -> (the microbatch's share of the loss, its per-row terms)
        a = x
        for layer in range(1, N_LAYERS + 1):
            columns = model_axis if layer % 2 == 1 else None  # W1's, W3's columns
            z = jnp.matmul(a, p[f"w{layer}"], out_sharding=P(data_axis, columns))
            # JAX adds no reduced value to a sharded one: the bias, broadcast
            # to every row, is resharded to the rows' split first
            z = z + jax.sharding.reshard(jnp.broadcast_to(p[f"b{layer}"], z.shape),
                                         P(data_axis, columns))
            a = z if layer == N_LAYERS else jax.nn.relu(z)
        terms = jnp.sum((a - y) ** 2, axis=1) / batch  # f32[b/m@data]
        return jnp.sum(terms), terms

    shares, terms = [], []
    xs, ys = microbatches(x, n_micro), microbatches(y, n_micro)
    for xk, yk in zip(xs, ys, strict=True):
        share, rows = jax.grad(loss_terms, has_aux=True)(held, xk, yk)
        shares.append(share)  # {"w2": f32[h1@model, h2]{U:data}, ...}
        terms.append(rows)
    # unreduced values add only to each other (sum() would start from 0)
    total = jax.tree_util.tree_map(lambda *g: functools.reduce(jnp.add, g),
                                   *shares)  # still {U:data}: no communication
    stored = fsdp_specs(data_axis, model_axis)
    grads = {k: jax.sharding.reshard(g, stored[k])  # the reduce-scatters
             for k, g in total.items()}
    return jnp.sum(functools.reduce(jnp.add, terms)), grads


def value_and_grad_deferred_explicit(mesh, model_axis=None, n_micro=2):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    specs = fsdp_specs(DATA, model_axis)
    program = jax.jit(functools.partial(value_and_grad_deferred_explicit_program,
                                        model_axis=model_axis, n_micro=n_micro))

    def run(params, x, y):
        with jax.set_mesh(mesh):
            params = jax.sharding.reshard(params, specs)
            x, y = jax.sharding.reshard((x, y), P(DATA))
            return program(params, x, y)

    return run
# [end:explicit]


# [start:pmap]
def train_pmap(params, x, y, n_devices, steps=STEPS):
    def split(a):  # [d0, ...] -> [n, d0/n, ...]: device i's block in row i
        return a.reshape(n_devices, -1, *a.shape[1:])

    optimizer = optax.adam(LR)
    blocks = jax.tree_util.tree_map(split, params)
    opt_state = jax.pmap(optimizer.init)(blocks)
    step = jax.pmap(functools.partial(step_per_device, optimizer=optimizer),
                    axis_name=DATA)
    for _ in range(steps):
        blocks, opt_state, _ = step(blocks, opt_state, split(x), split(y))
    return jax.tree_util.tree_map(
        lambda a: np.asarray(a).reshape(-1, *a.shape[2:]), blocks)
# [end:pmap]


# [start:numpy]
def forward_backward(p, x, y):
    # The forward and backward pass by hand, layer by layer, in plain array
    # arithmetic -> (loss, grads)
    acts, zs = [x], []
    for k in range(1, N_LAYERS + 1):
        zs.append(acts[-1] @ p[f"w{k}"] + p[f"b{k}"])
        acts.append(zs[-1] if k == N_LAYERS else np.maximum(zs[-1], 0))
    err = acts[-1] - y
    grad, grads = 2 * err / x.shape[0], {}
    for k in range(N_LAYERS, 0, -1):
        dz = grad if k == N_LAYERS else grad * (zs[k - 1] > 0)
        grads[f"w{k}"], grads[f"b{k}"] = acts[k - 1].T @ dz, dz.sum(0)
        if k > 1:
            grad = dz @ p[f"w{k}"].T
    return (err ** 2).sum() / x.shape[0], grads


def value_and_grad_numpy(params, x, y):
    # float64 throughout, rounded once at the end to the inputs' dtype
    dtype = np.result_type(*(np.asarray(a).dtype for a in (x, y, *params.values())))
    wide = {k: np.asarray(v, np.float64) for k, v in params.items()}
    loss, grads = forward_backward(wide, np.asarray(x, np.float64),
                                   np.asarray(y, np.float64))
    return (np.asarray(loss).astype(dtype),
            {k: g.astype(dtype) for k, g in grads.items()})


def train_numpy(params, x, y, steps=STEPS, b1=0.9, b2=0.999, eps=1e-8):
    # Adam by hand (optax.adam's defaults), in float64
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    for t in range(1, steps + 1):
        _, grads = value_and_grad_numpy(p, x, y)
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
    mesh = make_mesh((N_DEVICES,), (DATA,))
    tp_mesh = make_mesh((N_DEVICES // 2, 2), (DATA, MODEL))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((BATCH, SIZES[-1])).astype(np.float32)
    params = init_params(SIZES)

    # Loss and gradients: FSDP, and FSDP x TP (4-way data x 2-way model).
    loss, grads = value_and_grad_numpy(params, x, y)
    forms = {"shard_map": value_and_grad_shard_map(mesh),
             "jit": value_and_grad_jit(mesh),
             "shard_map FSDP x TP": value_and_grad_shard_map(tp_mesh, MODEL),
             "jit FSDP x TP": value_and_grad_jit(tp_mesh, MODEL),
             "explicit": value_and_grad_explicit(mesh),
             "explicit FSDP x TP": value_and_grad_explicit(tp_mesh, MODEL)}
    if jax.__version_info__[:3] >= DEFERRED_SUM_SINCE:
        forms["explicit, 2 microbatches, one deferred scatter"] = (
            value_and_grad_deferred_explicit(mesh))
        forms["explicit FSDP x TP, 2 microbatches, one deferred scatter"] = (
            value_and_grad_deferred_explicit(tp_mesh, MODEL))
    else:
        print(f"(the deferred reduce-scatter needs JAX >= 0.9.1; this is "
              f"{jax.__version__}: a reduce_sum of an unreduced value is refused "
              "there)")
    for form, f in forms.items():
        got_loss, got = f(params, x, y)
        np.testing.assert_allclose(float(got_loss), loss, rtol=1e-5, err_msg=form)
        for k in grads:
            np.testing.assert_allclose(np.asarray(got[k]), grads[k], rtol=1e-4,
                                       atol=1e-5, err_msg=f"{form} d{k}")
        w3 = got["w3"].sharding  # laid out as stored (the explicit form's
        # spec spells every dimension: P("data", None))
        want_w3 = fsdp_specs(DATA, MODEL if "TP" in form else None)["w3"]
        assert w3.is_equivalent_to(NamedSharding(w3.mesh, want_w3), 2), form

    # Training with Adam: every form against NumPy.
    want = train_numpy(params, x, y)
    results = {"shard_map": train_shard_map(params, x, y, mesh),
               "jit": train_jit(params, x, y, mesh)}
    for form, (trained, opt_state) in results.items():
        for k in want:
            np.testing.assert_allclose(np.asarray(trained[k]), want[k], rtol=1e-4,
                                       atol=1e-5, err_msg=f"{form} {k}")
        assert trained["w2"].sharding.spec == P(DATA), form
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
    got_loss, got = forms["jit FSDP x TP"](params, x, y)
    print(f"MLP {list(SIZES)}, batch {BATCH}, {STEPS} optax.adam steps, "
          f"{N_DEVICES}-way FSDP")
    print(f"loss: FSDP x TP jit {float(got_loss):.5f}, NumPy {float(loss):.5f} "
          "(mean over rows of sum((predict - y) ** 2))")
    print("d loss / d b4 (4 blocks of 2, over data):",
          [round(float(g), 4) for g in got["b4"]], "NumPy:",
          [round(float(g), 4) for g in grads["b4"]])
    print(f"params + Adam moments: {total} bytes in all, {mine} bytes per device "
          f"(1/{N_DEVICES})")
    print("ok: loss and gradients of FSDP and FSDP x TP (shard_map, jit, "
          "explicit: one batch, and two microbatches scattered once) equal NumPy; "
          "shard_map, jit and pmap FSDP training equal NumPy Adam; params and "
          "optimiser state stay sharded")


if __name__ == "__main__":
    main()
