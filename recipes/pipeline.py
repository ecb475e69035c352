"""Pipeline parallelism (GPipe): a layer per stage, microbatches passed on by ppermute.

What it shows: a model of S dense layers ``a -> tanh(a @ w[s] + b[s])``, layer
s on device s of a "stage" mesh axis (the stage parameters ``{"w": [S, d, d],
"b": [S, d]}`` stacked on a leading axis of size S, split over that axis),
and a mean-squared-error loss. The batch is cut into M microbatches. For
M + S - 1 ticks of one ``lax.scan``, stage 0 takes the next microbatch, every
other stage takes what its predecessor sent at the previous tick, applies its
layer and sends the result on with ``ppermute``. ``axis_index`` decides what a
stage does (stage 0 reads x; the last stage's outputs are the model's).
``jax.grad`` of that program is the backward pipeline: the transpose of each
ppermute sends the cotangents back. Loss and gradients (a dict shaped like the
parameters) equal running the layers in sequence on one device.

The bubble: each stage is busy on M of the M + S - 1 ticks, so the idle
fraction is (S - 1) / (M + S - 1): more microbatches, a smaller bubble (and
more activation memory: GPipe keeps M microbatches per stage).

Which form when:
  * shard_map: write the per-stage schedule, every ppermute in view.
  * jit: the same schedule on a [S, mb, d] state sharded over the stages:
    ``vmap`` applies each stage's layer to its row and ``jnp.roll`` shifts the
    state one stage on; XLA writes the roll as collective-permutes.
  * explicit: the jit schedule on Explicit axes: the state is created split
    over the stages and keeps that split in its type, so nothing is pinned.
  * pmap (legacy): the same per-stage body, pmapped over the stage axis.

The per-stage body, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["pipeline_mlp"]`` runs; ``axis`` names the stage
axis (other mesh axes may hold replicas of the pipeline).

Registered as: ``collectives.RECIPES["pipeline_mlp"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/pipeline.py``
"""


import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_STAGES = 8
MICROBATCHES = 4  # M
WIDTH, BATCH = 8, 32
AXIS = "stage"


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), (AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,))


def stage_layer(params, a):
    # params: one stage's layer {"w": [d, d], "b": [d]}; a: [mb, d] -> [mb, d]
    return jnp.tanh(a @ params["w"] + params["b"][None])


def bubble_fraction(stages, microbatches):
    return (stages - 1) / (microbatches + stages - 1)


def split_microbatches(a, microbatches):
    # a: [batch, d] -> [M, batch / M, d]
    return a.reshape(microbatches, a.shape[0] // microbatches, *a.shape[1:])


# [start:body]
def pipeline_forward(params, x, axis=AXIS, microbatches=MICROBATCHES,
                     layer=stage_layer):
    # params: this stage's layer {"w": [d, d], "b": [d]}; x: [batch, d] everywhere;
    # layer(params, a) -> a: [mb, d] -> [mb, d], the stage's layer (stage_layer)
    stages = lax.axis_size(axis)
    stage = lax.axis_index(axis)
    xs = split_microbatches(x, microbatches)  # [M, mb, d]
    # s -> s + 1; the wrap-around (last -> 0) is ignored by stage 0, which
    # reads x, and makes the shift a full permutation (vmap needs one).
    forward = [(s, (s + 1) % stages) for s in range(stages)]

    def tick(incoming, t):
        # incoming: [mb, d], what the previous stage sent at tick t - 1
        inp = jnp.where(stage == 0, xs[jnp.minimum(t, microbatches - 1)], incoming)
        out = layer(params, inp)
        return lax.ppermute(out, axis, forward), out

    # Tick 0's input: microbatch 0 on stage 0, zeros (ignored) elsewhere; it
    # varies over the stages, as the carry does from then on.
    start = jnp.where(stage == 0, xs[0], jnp.zeros_like(xs[0]))
    ticks = jnp.arange(microbatches + stages - 1)
    _, outs = lax.scan(tick, start, ticks, unroll=True)  # [M + S - 1, mb, d]
    return outs[stages - 1:]  # [M, mb, d]: on the last stage, the model's output


def pipeline_value_and_grad(stage_params, x, y, axis=AXIS, microbatches=MICROBATCHES,
                            layer=stage_layer):
    # stage_params: {"w": [1, d, d], "b": [1, d]} on each stage; x, y: [batch, d]
    stages = lax.axis_size(axis)
    last = lax.axis_index(axis) == stages - 1
    ys = split_microbatches(y, microbatches)

    def local_loss(block):
        params = jax.tree_util.tree_map(lambda a: a[0], block)
        outs = pipeline_forward(params, x, axis, microbatches, layer)
        return jnp.where(last, jnp.sum((outs - ys) ** 2), 0.0) / x.shape[0]

    local, grads = jax.value_and_grad(local_loss)(stage_params)
    # -> the loss (only the last stage's is nonzero) on every stage, and this
    # stage's gradients {"w": [1, d, d], "b": [1, d]}
    return lax.psum(local, axis), grads
# [end:body]


# [start:shard_map]
def pipeline_shard_map(params, x, y, mesh):
    stages = P(AXIS)
    f = jax.shard_map(pipeline_value_and_grad, mesh=mesh,
                      in_specs=({"w": stages, "b": stages}, P(), P()),
                      out_specs=(P(), {"w": stages, "b": stages}))
    return jax.jit(f)(params, x, y)
# [end:shard_map]


# [start:jit]
def pipeline_program(stage_params, x, y, mesh, axis=AXIS, microbatches=MICROBATCHES):
    # stage_params: {"w": [S, d, d], "b": [S, d]}, split over `axis`; x, y: [batch, d]
    stages = stage_params["w"].shape[0]
    xs = split_microbatches(x, microbatches)
    ys = split_microbatches(y, microbatches)
    stage = jnp.arange(stages)[:, None, None]

    def constrain(a):
        spec = P(axis, *([None] * (a.ndim - 1)))
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    def loss(params):
        def tick(carry, t):
            # state: [S, mb, d], stage s's input in row s; sums: [S]
            state, sums = carry
            new = xs[jnp.minimum(t, microbatches - 1)][None]  # [1, mb, d]
            state = jnp.where(stage == 0, new, state)
            out = constrain(jax.vmap(stage_layer)(params, state))
            done = t - (stages - 1)  # the microbatch leaving the last stage
            err = jnp.sum((out - ys[jnp.maximum(done, 0)][None]) ** 2, axis=(1, 2))
            keep = (stage[:, 0, 0] == stages - 1) & (done >= 0)
            sums = constrain(sums + jnp.where(keep, err, 0.0))
            # jnp.roll on the sharded stage axis: XLA sends each row on
            return (constrain(jnp.roll(out, 1, axis=0)), sums), None

        start = (constrain(jnp.zeros((stages, *xs.shape[1:]), x.dtype)),
                 constrain(jnp.zeros((stages,), x.dtype)))
        ticks = jnp.arange(microbatches + stages - 1)
        (_, sums), _ = lax.scan(tick, start, ticks, unroll=True)
        return jnp.sum(sums) / x.shape[0]  # only the last stage's sum is nonzero

    return jax.value_and_grad(loss)(stage_params)


def pipeline_jit(params, x, y, mesh):
    split, whole = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())
    f = jax.jit(lambda p, x, y: pipeline_program(p, x, y, mesh),
                in_shardings=({"w": split, "b": split}, whole, whole),
                out_shardings=(whole, {"w": split, "b": split}))
    return f(params, x, y)
# [end:jit]


# [start:explicit]
def pipeline_explicit_program(stage_params, x, y, mesh, axis=AXIS,
                              microbatches=MICROBATCHES):
    # pipeline_program on Explicit axes: stage_params["w"]: f32[S@axis, d, d];
    # x, y: f32[batch, d] on every device. The state is created split over
    # the stages (reshard of zeros: no communication) and every value
    # computed from it keeps that split, so no constraint is needed.
    del mesh  # the mesh in scope; the types name its axes
    stages = stage_params["w"].shape[0]
    xs = split_microbatches(x, microbatches)
    ys = split_microbatches(y, microbatches)

    def split(a):  # stage s's row on device s
        return jax.sharding.reshard(a, P(axis, *([None] * (a.ndim - 1))))

    stage = split(jnp.arange(stages))[:, None, None]  # i32[S@axis, 1, 1]

    # Explicit mode does not slice a dimension across its shards, as
    # jnp.roll of the stage axis must; auto_axes hands the roll to XLA's
    # partitioner (the collective-permutes) and types the result split again.
    shift = jax.sharding.auto_axes(lambda a: jnp.roll(a, 1, axis=0),
                                   out_sharding=P(axis))

    def loss(params):
        def tick(carry, t):
            # state: f32[S@axis, mb, d]; sums: f32[S@axis]
            state, sums = carry
            new = xs[jnp.minimum(t, microbatches - 1)][None]  # f32[1, mb, d]
            # where() takes its operands split alike (with one stage, size 1
            # broadcasts nothing): new, broadcast to every stage, split too
            # (each device keeps its row; no communication)
            state = jnp.where(stage == 0, split(jnp.broadcast_to(new, state.shape)),
                              state)
            out = jax.vmap(stage_layer)(params, state)  # f32[S@axis, mb, d]
            done = t - (stages - 1)
            err = jnp.sum((out - ys[jnp.maximum(done, 0)][None]) ** 2, axis=(1, 2))
            keep = (stage[:, 0, 0] == stages - 1) & (done >= 0)
            sums = sums + jnp.where(keep, err, 0.0)
            return (shift(out), sums), None

        start = (split(jnp.zeros((stages, *xs.shape[1:]), x.dtype)),
                 split(jnp.zeros((stages,), x.dtype)))
        ticks = jnp.arange(microbatches + stages - 1)
        (_, sums), _ = lax.scan(tick, start, ticks, unroll=True)
        return jnp.sum(sums) / x.shape[0]  # f32[]: the sum over axis

    return jax.value_and_grad(loss)(stage_params)  # grads: f32[S@axis, ...]


def pipeline_explicit(params, x, y, mesh):
    # mesh: the same devices and names with every axis Explicit
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
        jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
    with jax.set_mesh(mesh):
        params = jax.sharding.reshard(params, P(AXIS))
        x, y = jax.sharding.reshard((x, y), P())
        return jax.jit(lambda p, x, y: pipeline_explicit_program(p, x, y, mesh))(
            params, x, y)
# [end:explicit]


# [start:pmap]
def pipeline_pmap(params, x, y, n_stages):
    # pmap maps over a leading device axis: each stage gets {"w": [1, d, d], ...}
    blocks = jax.tree_util.tree_map(lambda a: a.reshape(n_stages, 1, *a.shape[1:]),
                                    params)
    f = jax.pmap(pipeline_value_and_grad, axis_name=AXIS, in_axes=(0, None, None))
    loss, grads = f(blocks, x, y)
    loss = np.asarray(loss)
    assert (loss == loss[0]).all(), "stages disagree on the loss"
    return loss[0], jax.tree_util.tree_map(lambda g: np.asarray(g)[:, 0], grads)
# [end:pmap]


# [start:numpy]
def forward_numpy(params, x):
    # The layers in sequence, in float64: every activation [x, a1, .., aS] and
    # every tanh's slope 1 - a**2.
    w, b = (np.asarray(params[k], np.float64) for k in ("w", "b"))
    acts, slopes = [np.asarray(x, np.float64)], []
    for s in range(w.shape[0]):
        acts.append(np.tanh(acts[-1] @ w[s] + b[s]))
        slopes.append(1 - acts[-1] ** 2)
    return acts, slopes


def backward_numpy(w, acts, slopes, grad):
    # grad: d loss / d (last activation); back through the layers by hand
    dw, db = np.zeros(w.shape), np.zeros((w.shape[0], w.shape[-1]))
    for s in reversed(range(w.shape[0])):
        dz = grad * slopes[s]
        dw[s], db[s], grad = acts[s].T @ dz, dz.sum(0), dz @ w[s].T
    return {"w": dw, "b": db}


def pipeline_numpy(params, x, y):
    # -> (loss, {"w": [S, d, d], "b": [S, d]}) in float64
    acts, slopes = forward_numpy(params, x)
    err = acts[-1] - np.asarray(y, np.float64)
    w = np.asarray(params["w"], np.float64)
    grads = backward_numpy(w, acts, slopes, 2 * err / err.shape[0])
    return np.asarray(np.sum(err ** 2) / err.shape[0]), grads
# [end:numpy]


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_STAGES)
    mesh = make_mesh(N_STAGES)
    rng = np.random.default_rng(0)
    params = {"w": (rng.standard_normal((N_STAGES, WIDTH, WIDTH))
                    / np.sqrt(WIDTH)).astype(np.float32),
              "b": (0.1 * rng.standard_normal((N_STAGES, WIDTH))).astype(np.float32)}
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    y = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    want_loss, want = pipeline_numpy(params, x, y)
    forms = {"shard_map": pipeline_shard_map(params, x, y, mesh),
             "jit": pipeline_jit(params, x, y, mesh),
             "explicit": pipeline_explicit(params, x, y, mesh),
             "pmap": pipeline_pmap(params, x, y, N_STAGES)}
    for form, (loss, grads) in forms.items():
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, err_msg=form)
        for key in ("w", "b"):
            np.testing.assert_allclose(np.asarray(grads[key]), want[key], rtol=1e-4,
                                       atol=1e-6, err_msg=f"{form} d{key}")
    fractions = {m: bubble_fraction(N_STAGES, m) for m in (1, 2, 4, 8, 16, 32)}
    assert all(a > b for a, b in zip(list(fractions.values())[:-1],
                                     list(fractions.values())[1:], strict=True))
    print(f"GPipe: {N_STAGES} stages x width {WIDTH}, batch {BATCH} in "
          f"{MICROBATCHES} microbatches of {BATCH // MICROBATCHES} rows")
    print(f"loss sum((model(x) - y)**2) / {BATCH}: NumPy {float(want_loss):.6f}, "
          + ", ".join(f"{form} {float(loss):.6f}" for form, (loss, _) in forms.items()))
    def first3(b):
        return ", ".join(f"{v:.5f}" for v in np.asarray(b)[-1, :3])

    print(f"d loss / d b of the last stage, first 3: NumPy [{first3(want['b'])}], "
          f"shard_map [{first3(forms['shard_map'][1]['b'])}]")
    print("bubble (S-1)/(M+S-1):",
          ", ".join(f"M={m}: {f:.2f}" for m, f in fractions.items()),
          f"(M={MICROBATCHES}: {N_STAGES - 1}/{MICROBATCHES + N_STAGES - 1})")
    print("ok: loss and gradients of shard_map, jit, explicit and pmap equal the "
          "layers run in sequence (NumPy)")


if __name__ == "__main__":
    main()
