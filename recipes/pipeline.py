"""Pipeline parallelism (GPipe): a layer per stage, microbatches passed on by ppermute.

What it shows: a model of S dense layers ``a -> tanh(a @ w[s] + b[s])``, layer
s on device s of a "stage" mesh axis (the stage parameters stacked on a
leading axis of size S, split over that axis). The batch is cut into M
microbatches. For M + S - 1 ticks of one ``lax.scan``, stage 0 takes the
next microbatch, every other stage takes what its predecessor sent at the
previous tick, applies its layer and sends the result on with ``ppermute``.
``axis_index`` decides what a stage does (stage 0 reads x; the last stage's
outputs are the model's). ``jax.grad`` of that program is the backward
pipeline: the transpose of each ppermute sends the cotangents back. Loss and
gradients equal running the layers in sequence on one device.

The bubble: each stage is busy on M of the M + S - 1 ticks, so the idle
fraction is (S - 1) / (M + S - 1): more microbatches, a smaller bubble (and
more activation memory: GPipe keeps M microbatches per stage).

Which form when:
  * shard_map: write the per-stage schedule, every ppermute in view.
  * jit: the same schedule on a [S, mb, d] state sharded over the stages:
    ``vmap`` applies each stage's layer to its row and ``jnp.roll`` shifts the
    state one stage on; XLA writes the roll as collective-permutes.
  * pmap (legacy): the same per-stage body, pmapped over the stage axis.

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
MICROBATCHES = 8
WIDTH, BATCH = 8, 32


def make_mesh(n_devices):
    # Auto axes on every JAX version (jax.make_mesh defaults to Explicit from 0.9).
    return jax.make_mesh((n_devices,), ("stage",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def layer(w, b, a):
    return jnp.tanh(a @ w + b[None])  # a: [mb, d]


def bubble_fraction(stages, microbatches):
    return (stages - 1) / (microbatches + stages - 1)


# [start:shard_map]
def per_stage_loss(w, b, x, y, microbatches):
    # w: [1, d, d], b: [1, d] (this stage's layer); x, y: [batch, d] everywhere
    stages = lax.axis_size("stage")
    stage = lax.axis_index("stage")
    xs = x.reshape(microbatches, -1, x.shape[-1])  # [M, mb, d]
    ys = y.reshape(microbatches, -1, y.shape[-1])
    ring = [(s, (s + 1) % stages) for s in range(stages)]  # stage 0 ignores the wrap

    def tick(incoming, t):
        inp = jnp.where(stage == 0, xs[jnp.minimum(t, microbatches - 1)], incoming)
        out = layer(w[0], b[0], inp)
        return lax.ppermute(out, "stage", ring), out

    start = jnp.where(stage == 0, xs[0], jnp.zeros_like(xs[0]))
    _, outs = lax.scan(tick, start, jnp.arange(microbatches + stages - 1))
    outs = outs[stages - 1:]  # on the last stage: microbatches 0..M-1 out
    return jnp.where(stage == stages - 1, jnp.sum((outs - ys) ** 2), 0.0) / x.shape[0]


def value_and_grad_per_stage(w, b, x, y, microbatches=MICROBATCHES):
    loss, grads = jax.value_and_grad(per_stage_loss, argnums=(0, 1))(
        w, b, x, y, microbatches)
    return lax.psum(loss, "stage"), grads  # only the last stage's loss is nonzero


def pipeline_shard_map(params, x, y, mesh):
    f = jax.shard_map(value_and_grad_per_stage, mesh=mesh,
                      in_specs=(P("stage"), P("stage"), P(), P()),
                      out_specs=(P(), (P("stage"), P("stage"))))
    return jax.jit(f)(params["w"], params["b"], x, y)
# [end:shard_map]


# [start:jit]
def pipeline_jit(params, x, y, mesh, microbatches=MICROBATCHES):
    stages = params["w"].shape[0]
    stage = jnp.arange(stages)[:, None, None]

    def constrain(a):
        spec = P("stage", *([None] * (a.ndim - 1)))
        return lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

    def loss(w, b, x, y):
        xs = x.reshape(microbatches, -1, x.shape[-1])
        ys = y.reshape(microbatches, -1, y.shape[-1])

        def tick(state, t):  # state: [S, mb, d], stage s's input in row s
            new = xs[jnp.minimum(t, microbatches - 1)][None]
            out = constrain(jax.vmap(layer)(w, b, jnp.where(stage == 0, new, state)))
            return constrain(jnp.roll(out, 1, axis=0)), out[stages - 1]

        start = constrain(jnp.zeros((stages, *xs.shape[1:]), x.dtype))
        _, outs = lax.scan(tick, start, jnp.arange(microbatches + stages - 1))
        return jnp.sum((outs[stages - 1:] - ys) ** 2) / x.shape[0]

    split, whole = NamedSharding(mesh, P("stage")), NamedSharding(mesh, P())
    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)),
                in_shardings=(split, split, whole, whole),
                out_shardings=(whole, (split, split)))
    return f(params["w"], params["b"], x, y)
# [end:jit]


# [start:pmap]
def pipeline_pmap(params, x, y, n_stages):
    f = jax.pmap(value_and_grad_per_stage, axis_name="stage",
                 in_axes=(0, 0, None, None))
    loss, (dw, db) = f(params["w"][:, None], params["b"][:, None], x, y)
    loss = np.asarray(loss)
    assert (loss == loss[0]).all(), "stages disagree on the loss"
    return loss[0], (np.asarray(dw)[:, 0], np.asarray(db)[:, 0])
# [end:pmap]


# [start:numpy]
def pipeline_numpy(params, x, y):
    # The layers in sequence, forward and backward by hand, in float64.
    w, b = params["w"].astype(np.float64), params["b"].astype(np.float64)
    acts = [x.astype(np.float64)]
    for s in range(w.shape[0]):
        acts.append(np.tanh(acts[-1] @ w[s] + b[s]))
    err = acts[-1] - y
    grad, dw, db = 2 * err / x.shape[0], np.zeros_like(w), np.zeros_like(b)
    for s in reversed(range(w.shape[0])):
        dz = grad * (1 - acts[s + 1] ** 2)
        dw[s], db[s], grad = acts[s].T @ dz, dz.sum(0), dz @ w[s].T
    return np.sum(err ** 2) / x.shape[0], (dw, db)
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
             "pmap": pipeline_pmap(params, x, y, N_STAGES)}
    for form, (loss, grads) in forms.items():
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, err_msg=form)
        for got, expected in zip(grads, want, strict=True):
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4,
                                       atol=1e-6, err_msg=form)
    fractions = {m: bubble_fraction(N_STAGES, m) for m in (1, 2, 4, 8, 16, 32)}
    assert all(a > b for a, b in zip(list(fractions.values())[:-1],
                                     list(fractions.values())[1:], strict=True))
    print(f"GPipe: {N_STAGES} stages x width {WIDTH}, batch {BATCH} in "
          f"{MICROBATCHES} microbatches; loss {float(want_loss):.4f}")
    print("bubble (S-1)/(M+S-1):",
          ", ".join(f"M={m}: {f:.2f}" for m, f in fractions.items()))
    print("ok: loss and gradients of shard_map, jit and pmap equal the layers "
          "run in sequence (NumPy)")


if __name__ == "__main__":
    main()
