"""Data- and tensor-parallel MLP training: 8-way data, and 4-way data x 2-way model.

What it shows: the MLP of JAX's "distributed arrays" tutorial, written for
today's JAX (``NamedSharding`` and ``PartitionSpec`` where the tutorial used
the removed ``PositionalSharding``). A relu MLP with layers
``[784, 8192, 8192, 8192, 10]``, batch 8192, mean-squared-error loss and plain
SGD ``W -= lr * dW``; here the sizes are parameters with a small default that
runs on CPU in seconds. Two layouts:

  * 8-way data parallel: the batch split over all devices, every parameter
    replicated; the gradients are summed over devices (one all-reduce).
  * 4-way data x 2-way model (tensor) parallel: the batch split 4 ways over
    "data"; Megatron tensor parallelism over "model" on both layer pairs,
    (W1, W2) and (W3, W4). W1 and W3 (with b1 and b3) are split on their
    output dimension (column parallel), W2 and W4 on their input dimension
    (row parallel), b2 and b4 replicated. Each device computes its columns
    of a pair's hidden layer and multiplies them by its rows of the pair's
    second weight; one all-reduce over "model" completes the pair's output
    (Megatron's g). Backward, its transpose (Megatron's f) completes the
    gradient flowing out of W3 into the second hidden layer; before W1 none
    is needed, as no gradient flows into x. The gradients are then summed
    over "data".

Which form when:
  * jit: write the global model, place the parameters and the batch with
    NamedSharding (pin intermediates with ``with_sharding_constraint`` if you
    like); XLA inserts the same four all-reduces as the hand-written version.
  * shard_map: write the per-device program with every psum in view (here the
    backward pass too, by hand).
  * explicit: the global model on Explicit axes, shardings in the types:
    no constraints; the two ambiguous products (W2's and W4's input
    dimension split over "model") name their output sharding with
    ``out_sharding=``. Accumulating microbatches, each one's gradient is
    all-reduced over "data" as it is taken
    (``value_and_grad_microbatches_explicit_program``); parameters
    resharded to ``reduced`` over "data" get ``unreduced`` gradients, which
    add up on each device and one ``reshard`` sums: one all-reduce over
    "data" for all microbatches, half the bytes for two
    (``value_and_grad_deferred_explicit_program``,
    ``collectives.RECIPES["dp_tp_mlp"]``'s explicit form; JAX >= 0.9.1).
  * pmap: the legacy data-parallel form (grads then ``psum``). It has no
    second device axis: the model axis can only be ``vmap``ped on each device,
    which computes the same numbers but does not spread the model.

The per-device body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["dp_tp_mlp"]`` and ``["dp_mlp"]`` run: the data
axis may be one mesh axis name or a tuple of them.

Registered as: ``collectives.RECIPES["dp_tp_mlp"]``,
``collectives.RECIPES["dp_mlp"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/dp_tp_mlp.py``
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DEFERRED_SUM_SINCE = (0, 9, 1)  # summing unreduced gradients: refused before
N_DEVICES = 8
TUTORIAL_SIZES, TUTORIAL_BATCH = (784, 8192, 8192, 8192, 10), 8192  # lr 1e-5
SIZES, BATCH, LR, STEPS = (16, 64, 64, 64, 4), 64, 0.03, 10
DATA, MODEL = "data", "model"
PARAM_NAMES = ("w1", "b1", "w2", "b2", "w3", "b3", "w4", "b4")


def make_mesh(shape, names):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


def init_params(sizes, seed=0, dtype=np.float32):
    # weights [fan_in, fan_out] scaled by 1/sqrt(fan_in), biases [fan_out]
    rng = np.random.default_rng(seed)
    params = {}
    for layer in range(1, len(sizes)):
        fan_in, fan_out = sizes[layer - 1], sizes[layer]
        params[f"w{layer}"] = (rng.standard_normal((fan_in, fan_out))
                               / np.sqrt(fan_in)).astype(dtype)
        params[f"b{layer}"] = (0.1 * rng.standard_normal(fan_out)).astype(dtype)
    return params


def param_specs(model_axis=None):
    # model_axis None: everything replicated (data parallel); else Megatron
    # on both layer pairs: W1, b1 and W3, b3 split by columns, W2 and W4 by
    # rows over model_axis, b2 and b4 replicated
    specs = {name: P() for name in PARAM_NAMES}
    if model_axis is not None:
        specs.update(w1=P(None, model_axis), b1=P(model_axis), w2=P(model_axis),
                     w3=P(None, model_axis), b3=P(model_axis), w4=P(model_axis))
    return specs


def sgd(params, grads, lr):
    return jax.tree_util.tree_map(lambda w, g: w - lr * g, params, grads)


# [start:body]
def value_and_grad_per_device(p, x, y, data_axis=DATA, model_axis=None):
    # x: [b, d_in], y: [b, d_out] on each device. With model_axis (t
    # devices) these are this device's blocks: w1 [d_in, h1/t], b1 [h1/t],
    # w2 [h1/t, h2], w3 [h2, h3/t], b3 [h3/t], w4 [h3/t, d_out]; b2 and b4
    # are whole (None: no model axis, every parameter whole).
    # data_axis: a name or a tuple.
    batch = x.shape[0] * lax.axis_size(data_axis)  # rows on all devices

    def over_model(a):
        return a if model_axis is None else lax.psum(a, model_axis)

    z1 = x @ p["w1"] + p["b1"][None]          # [b, h1/t]: my columns
    a1 = jax.nn.relu(z1)
    z2 = over_model(a1 @ p["w2"]) + p["b2"][None]  # partial sums -> [b, h2]
    a2 = jax.nn.relu(z2)
    z3 = a2 @ p["w3"] + p["b3"][None]         # [b, h3/t]: my columns
    a3 = jax.nn.relu(z3)
    err = over_model(a3 @ p["w4"]) + p["b4"][None] - y  # partial sums -> [b, d_out]
    loss = lax.psum(jnp.sum(err ** 2), data_axis) / batch
    # backward, by hand: d loss / d output = 2 err / batch
    d_out = 2 * err / batch                   # [b, d_out], whole
    d_z3 = (d_out @ p["w4"].T) * (z3 > 0)     # [b, h3/t]
    d_z2 = over_model(d_z3 @ p["w3"].T) * (z2 > 0)  # partial sums -> [b, h2]
    d_z1 = (d_z2 @ p["w2"].T) * (z1 > 0)      # [b, h1/t]; x needs no gradient
    grads = {"w1": x.T @ d_z1, "b1": d_z1.sum(0), "w2": a1.T @ d_z2,
             "b2": d_z2.sum(0), "w3": a2.T @ d_z3, "b3": d_z3.sum(0),
             "w4": a3.T @ d_out, "b4": d_out.sum(0)}
    # loss: a scalar; grads shaped like p (blocks where p holds blocks), both
    # the same on every device of data_axis: add up the batch over it
    return loss, lax.psum(grads, data_axis)
# [end:body]


# [start:shard_map]
def value_and_grad_shard_map(mesh, model_axis):
    specs = param_specs(model_axis)
    body = functools.partial(value_and_grad_per_device, data_axis=DATA,
                             model_axis=model_axis)
    return jax.shard_map(body, mesh=mesh, in_specs=(specs, P(DATA), P(DATA)),
                         out_specs=(P(), specs))
# [end:shard_map]


# [start:jit]
def forward(p, x, constrain=lambda a, kind: a):
    # the global model; constrain(a, kind) may pin a layout on the
    # activations: "rows" (batch split) or "columns" (also split like the
    # columns of W1 or W3)
    z1 = constrain(x @ p["w1"] + p["b1"][None], "columns")
    z2 = constrain(jax.nn.relu(z1) @ p["w2"] + p["b2"][None], "rows")
    z3 = constrain(jax.nn.relu(z2) @ p["w3"] + p["b3"][None], "columns")
    return constrain(jax.nn.relu(z3) @ p["w4"] + p["b4"][None], "rows")


def mlp_loss(p, x, y, constrain=lambda a, kind: a):
    # mean over the batch of sum((predict(x) - y) ** 2, -1)
    return jnp.sum((forward(p, x, constrain) - y) ** 2) / x.shape[0]


def value_and_grad_program(params, x, y, mesh, data_axis=DATA, model_axis=None):
    # jax.value_and_grad of the global loss; the constraints pin the Megatron
    # layout of the activations (XLA would find it from the parameters
    # anyway) and XLA inserts the same four all-reduces
    layouts = {"rows": P(data_axis), "columns": P(data_axis, model_axis)}

    def constrain(a, kind):
        return lax.with_sharding_constraint(a, NamedSharding(mesh, layouts[kind]))

    return jax.value_and_grad(mlp_loss)(params, x, y, constrain)


def value_and_grad_jit(mesh, model_axis):
    def place(spec):
        return NamedSharding(mesh, spec)

    shardings = jax.tree_util.tree_map(place, param_specs(model_axis))
    program = functools.partial(value_and_grad_program, mesh=mesh, data_axis=DATA,
                                model_axis=model_axis)
    return jax.jit(program,
                   in_shardings=(shardings, place(P(DATA)), place(P(DATA))),
                   out_shardings=(place(P()), shardings))
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
    # Explicit axes: each array's type carries its sharding (x: f32[b@data, d],
    # w1: f32[d, h1@model]), so nothing needs pinning. Two products are
    # ambiguous: a1 @ w2 and a3 @ w4 contract a dimension split over
    # model_axis; out_sharding says the result is whole over model (the sum,
    # an all-reduce). The transpose of a2 @ w3 sums the gradient flowing
    # into the second hidden layer over model_axis.
    def loss(p):
        a1 = jax.nn.relu(x @ p["w1"] + p["b1"][None])  # f32[b@data, h1@model]
        a2 = jax.nn.relu(jnp.matmul(a1, p["w2"], out_sharding=P(data_axis))
                         + p["b2"][None])  # f32[b@data, h2]
        a3 = jax.nn.relu(a2 @ p["w3"] + p["b3"][None])  # f32[b@data, h3@model]
        out = jnp.matmul(a3, p["w4"], out_sharding=P(data_axis)) + p["b4"][None]
        return jnp.sum((out - y) ** 2) / x.shape[0]  # out: f32[b@data, d_out]

    # grads: typed like params (b2: f32[h2], replicated: JAX sums the
    # batch's contributions over data_axis; w2: f32[h1@model, h2])
    return jax.value_and_grad(loss)(params)


def value_and_grad_explicit(mesh, model_axis):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    specs = param_specs(model_axis)
    program = jax.jit(functools.partial(value_and_grad_explicit_program,
                                        data_axis=DATA, model_axis=model_axis))

    def run(params, x, y):
        with jax.set_mesh(mesh):
            params = jax.sharding.reshard(params, specs)
            x, y = jax.sharding.reshard((x, y), P(DATA))
            return program(params, x, y)

    return run


def value_and_grad_microbatches_explicit_program(params, x, y, data_axis=DATA,
                                                 model_axis=None, n_micro=2):
    # Gradient accumulation over n_micro microbatches, each gradient typed
    # like params and so summed over data_axis as it is taken: n_micro
    # all-reduces of the gradients (XLA may combine them into one of
    # n_micro gradients' size)
    xs, ys = microbatches(x, n_micro), microbatches(y, n_micro)
    taken = [value_and_grad_explicit_program(params, xk, yk, data_axis, model_axis)
             for xk, yk in zip(xs, ys, strict=True)]
    return jax.tree_util.tree_map(lambda *v: sum(v) / n_micro, *taken)


def value_and_grad_deferred_explicit_program(params, x, y, data_axis=DATA,
                                             model_axis=None, n_micro=2):
    # The same, the sum over data_axis deferred: params resharded to
    # "reduced" over it (w2: f32[h1@model, h2]{R:data}, its layout and
    # replicated over data, its gradient allowed to stay a per-device
    # partial sum), so each microbatch's gradient comes back unreduced
    # (f32[h1@model, h2]{U:data}: this device's rows' share). The shares
    # add up with no communication; one reshard to params' layout sums them
    # over data_axis: one all-reduce of one gradient's size. The loss's
    # per-row terms (f32[b/m@data]) are added up the same way.
    data = set(data_axis if isinstance(data_axis, tuple) else (data_axis,))
    batch = x.shape[0]  # the whole batch's rows: the shares add up to the mean
    specs = {k: jax.typeof(v).sharding.spec for k, v in params.items()}
    held = {k: jax.sharding.reshard(v, P(*specs[k], reduced=data))
            for k, v in params.items()}

    def dense(a, w, b, columns):
        # JAX adds no reduced value to a sharded one: the bias, broadcast to
        # every row, is resharded to the rows' split first
        z = jnp.matmul(a, w, out_sharding=P(data_axis, columns))
        return z + jax.sharding.reshard(jnp.broadcast_to(b, z.shape),
                                        P(data_axis, columns))

    def loss_terms(p, x, y):
        # -> (the microbatch's share of the loss, its per-row terms)
        a1 = jax.nn.relu(dense(x, p["w1"], p["b1"], model_axis))
        a2 = jax.nn.relu(dense(a1, p["w2"], p["b2"], None))  # sums over model
        a3 = jax.nn.relu(dense(a2, p["w3"], p["b3"], model_axis))
        out = dense(a3, p["w4"], p["b4"], None)  # f32[b/m@data, d_out]
        terms = jnp.sum((out - y) ** 2, axis=1) / batch  # f32[b/m@data]
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
    grads = {k: jax.sharding.reshard(g, specs[k]) for k, g in total.items()}
    return jnp.sum(functools.reduce(jnp.add, terms)), grads


def value_and_grad_deferred_explicit(mesh, model_axis, n_micro=2):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    specs = param_specs(model_axis)
    program = jax.jit(functools.partial(value_and_grad_deferred_explicit_program,
                                        data_axis=DATA, model_axis=model_axis,
                                        n_micro=n_micro))

    def run(params, x, y):
        with jax.set_mesh(mesh):
            params = jax.sharding.reshard(params, specs)
            x, y = jax.sharding.reshard((x, y), P(DATA))
            return program(params, x, y)

    return run
# [end:explicit]


# [start:pmap]
def first_copy(a):
    # pmap(out_axes=None) would not check that the copies agree: check here
    a = np.asarray(a)
    assert (a == a[0]).all(), "device copies differ"
    return a[0]


def value_and_grad_pmap(params, x, y, n_data, model=1):
    xs, ys = (a.reshape(n_data, -1, a.shape[-1]) for a in (x, y))  # [n, b, ...]
    body = functools.partial(value_and_grad_per_device, data_axis=DATA,
                             model_axis=MODEL if model > 1 else None)
    if model == 1:
        loss, grads = jax.pmap(body, axis_name=DATA, in_axes=(None, 0, 0))(
            params, xs, ys)
        return first_copy(loss), jax.tree_util.tree_map(first_copy, grads)
    # The model blocks of every split parameter stacked on a leading axis,
    # vmapped; dims: the dimension each one splits over the model axis.
    dims = {name: spec.index(MODEL) for name, spec in param_specs(MODEL).items()
            if MODEL in spec}
    blocks = {name: np.stack(np.split(params[name], model, axis=dim))
              for name, dim in dims.items()}
    in_axes = {name: 0 if name in blocks else None for name in params}
    inner = jax.vmap(body, in_axes=(in_axes, None, None), axis_name=MODEL)
    loss, grads = jax.pmap(inner, axis_name=DATA, in_axes=(None, 0, 0))(
        {**params, **blocks}, xs, ys)  # every leaf: [n_data, model, ...]
    grads = jax.tree_util.tree_map(first_copy, grads)  # -> [model, ...]
    joined = {name: np.concatenate(grads[name], axis=dim)
              for name, dim in dims.items()}
    rest = {k: first_copy(v) for k, v in grads.items() if k not in joined}
    return first_copy(first_copy(loss)), {**rest, **joined}
# [end:pmap]


# [start:numpy]
def forward_backward(p, x, y):
    # The forward and backward pass by hand, in plain array arithmetic
    z1 = x @ p["w1"] + p["b1"]
    a1 = np.maximum(z1, 0)
    z2 = a1 @ p["w2"] + p["b2"]
    a2 = np.maximum(z2, 0)
    z3 = a2 @ p["w3"] + p["b3"]
    a3 = np.maximum(z3, 0)
    err = a3 @ p["w4"] + p["b4"] - y
    d_out = 2 * err / x.shape[0]
    d_z3 = (d_out @ p["w4"].T) * (z3 > 0)
    d_z2 = (d_z3 @ p["w3"].T) * (z2 > 0)
    d_z1 = (d_z2 @ p["w2"].T) * (z1 > 0)
    grads = {"w1": x.T @ d_z1, "b1": d_z1.sum(0), "w2": a1.T @ d_z2,
             "b2": d_z2.sum(0), "w3": a2.T @ d_z3, "b3": d_z3.sum(0),
             "w4": a3.T @ d_out, "b4": d_out.sum(0)}
    return (err ** 2).sum() / x.shape[0], grads


def value_and_grad_numpy(params, x, y):
    # float64 throughout, rounded once at the end to the inputs' dtype
    dtype = np.result_type(*(np.asarray(a).dtype for a in (x, y, *params.values())))
    wide = {k: np.asarray(v, np.float64) for k, v in params.items()}
    loss, grads = forward_backward(wide, np.asarray(x, np.float64),
                                   np.asarray(y, np.float64))
    return (np.asarray(loss).astype(dtype),
            {k: g.astype(dtype) for k, g in grads.items()})
# [end:numpy]


def assert_close(got, want, what):
    loss, grads = got
    np.testing.assert_allclose(float(loss), want[0], rtol=1e-5, err_msg=what)
    for name, g in grads.items():
        np.testing.assert_allclose(np.asarray(g), want[1][name], rtol=1e-4,
                                   atol=1e-6, err_msg=f"{what}: d{name}")


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.standard_normal((BATCH, SIZES[-1])).astype(np.float32)
    params = init_params(SIZES)
    want = value_and_grad_numpy(params, x, y)

    dp_mesh = make_mesh((N_DEVICES,), (DATA,))
    tp_mesh = make_mesh((N_DEVICES // 2, 2), (DATA, MODEL))
    forms = {"dp jit": value_and_grad_jit(dp_mesh, None),
             "dp shard_map": jax.jit(value_and_grad_shard_map(dp_mesh, None)),
             "dp+tp jit": value_and_grad_jit(tp_mesh, MODEL),
             "dp+tp shard_map": jax.jit(value_and_grad_shard_map(tp_mesh, MODEL)),
             "dp explicit": value_and_grad_explicit(dp_mesh, None),
             "dp+tp explicit": value_and_grad_explicit(tp_mesh, MODEL)}
    if jax.__version_info__[:3] >= DEFERRED_SUM_SINCE:
        forms["dp explicit, 2 microbatches, one deferred sum"] = (
            value_and_grad_deferred_explicit(dp_mesh, None))
        forms["dp+tp explicit, 2 microbatches, one deferred sum"] = (
            value_and_grad_deferred_explicit(tp_mesh, MODEL))
    else:
        print(f"(the deferred sum needs JAX >= 0.9.1; this is {jax.__version__}: "
              "a reduce_sum of an unreduced value is refused there)")
    for what, f in forms.items():
        assert_close(f(params, x, y), want, what)
    assert_close(value_and_grad_pmap(params, x, y, N_DEVICES), want, "dp pmap")
    assert_close(value_and_grad_pmap(params, x, y, N_DEVICES // 2, model=2), want,
                 "dp+tp pmap(vmap)")

    # Train with SGD in the DP+TP layout, jit and shard_map, against NumPy.
    numpy_params = {k: v.astype(np.float64) for k, v in params.items()}
    numpy_losses = []
    for _ in range(STEPS):
        loss, grads = value_and_grad_numpy(numpy_params, x, y)
        numpy_losses.append(loss)
        numpy_params = {k: numpy_params[k] - LR * grads[k] for k in grads}
    assert all(np.diff(numpy_losses) < 0), numpy_losses
    for what in ("dp+tp jit", "dp+tp shard_map"):
        value_and_grad = forms[what]

        @jax.jit
        def step(p, x, y, value_and_grad=value_and_grad):
            loss, grads = value_and_grad(p, x, y)
            return loss, sgd(p, grads, LR)

        p, losses = params, []
        for _ in range(STEPS):
            loss, p = step(p, x, y)
            losses.append(float(loss))
        np.testing.assert_allclose(losses, numpy_losses, rtol=1e-5, err_msg=what)
        assert p["w1"].sharding.spec == P(None, MODEL), p["w1"].sharding
        assert p["w2"].sharding.spec == P(MODEL), p["w2"].sharding
    print(f"MLP {list(SIZES)} (tutorial: {list(TUTORIAL_SIZES)}), batch {BATCH}, "
          f"{N_DEVICES} devices")
    loss, grads = forms["dp+tp shard_map"](params, x, y)
    err = np.asarray(jax.jit(forward)(params, x), np.float64) - y  # [batch, d_out]
    print(f"loss {float(loss):.4f}; by hand, the mean over rows of "
          f"sum((predict - y) ** 2): {np.mean(np.sum(err ** 2, -1)):.4f}")
    print("d loss / d b4:", [round(float(v), 4) for v in grads["b4"]])
    print("by hand, 2 * (column means of predict - y):",
          [round(float(v), 4) for v in 2 * err.mean(0)])
    print(f"loss over {STEPS} SGD steps (lr {LR}):",
          " ".join(f"{v:.3f}" for v in numpy_losses))
    print("ok: loss and gradients agree with NumPy in jit, shard_map, explicit (one "
          "batch; two microbatches, summed once) and pmap form (8-way data and "
          "4x2 data x model), and SGD lowers the loss")


if __name__ == "__main__":
    main()
