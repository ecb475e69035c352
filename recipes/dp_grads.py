"""Data-parallel gradients: the full-batch gradient from per-device shards.

What it shows: a linear model ``y ~ x @ w + b`` with parameters
``{"w": w, "b": b}`` replicated on every device and the batch ``(x, y)``
split by rows. Each device differentiates the mean squared error on its
rows; the mean of those gradients over devices (``pmean``) is the gradient
of the full-batch loss, because every device holds the same number of rows.

Which form when:
  * pmap (legacy): ``jax.grad`` inside the body, then ``pmean``.
  * shard_map: the same, but mark the replicated parameters *varying* first
    (``lax.pcast(p, "i", to="varying")``; ``lax.pvary`` on JAX 0.8.0 and 0.8.1), or
    differentiate the whole program: ``jax.grad(shard_map(pmean(loss)))``.
    Porting the pmap body as is (``check_vma=True``, parameters ``P()``)
    returns gradients n times too large; ``guides/sharp_edges_grads.py`` shows why.
  * jit: ``jax.grad`` of the global loss with the batch sharded; XLA inserts
    the all-reduce of the partial gradients.
  * explicit: the global program on Explicit axes, where the types show the
    sum: a replicated parameter's gradient is replicated, so ``jax.grad``
    sums it over the batch axis. Parameters resharded to ``reduced`` over
    that axis get ``unreduced`` gradients instead: accumulate microbatches
    without communicating and sum once (``dp_grads_deferred_program``, from
    JAX 0.9.1; the registered explicit form runs it on the whole batch as
    one microbatch, and ``jax.grad``'s own sum before 0.9.1). One
    all-reduce, as in the jit form.

Exactness: with integer-valued data and a batch size times output width that
is a power of two, every scaling is a power of two and every sum an exact
integer, so all forms equal the NumPy closed form bit for bit.

The per-device bodies, the global program and the NumPy oracle below are the
ones ``collectives.RECIPES["dp_grads"]`` runs: ``axis`` may be one mesh axis
name or a tuple of them (the batch split over several axes).

Registered as: ``collectives.RECIPES["dp_grads"]``.
Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python recipes/dp_grads.py``
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
AXIS = "i"


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
    residual = x @ params["w"] + params["b"][None, :] - y
    return jnp.mean(residual ** 2)


def tree_pmean(tree, axis):
    return jax.tree_util.tree_map(lambda g: lax.pmean(g, axis), tree)


# [start:body]
# params: replicated; x: [k, d], y: [k, o] on each device
# -> {"w": [d, o], "b": [o]}, the full-batch gradient on every device
def dp_grads_body(params, x, y, axis=AXIS):
    # shard_map: params are invariant over axis. Marked varying, jax.grad is
    # this device's gradient (no hidden psum); pmean averages them.
    return tree_pmean(jax.grad(mse)(pvary(params, axis), x, y), axis)


def dp_grads_pmap_body(params, x, y, axis=AXIS):
    # pmap has no varying/invariant types: jax.grad is per device
    return tree_pmean(jax.grad(mse)(params, x, y), axis)
# [end:body]


# [start:pmap]
def dp_grads_pmap(params, x, y, n_devices):
    xs = x.reshape(n_devices, -1, x.shape[1])  # [n, b/n, d]
    ys = y.reshape(n_devices, -1, y.shape[1])  # [n, b/n, o]
    grads = jax.pmap(dp_grads_pmap_body, axis_name=AXIS, in_axes=(None, 0, 0))(
        params, xs, ys)
    for g in jax.tree_util.tree_leaves(grads):  # the same on every device
        copies = np.asarray(g)
        assert (copies == copies[0]).all(), "device copies differ"
    return jax.tree_util.tree_map(lambda g: np.asarray(g)[0], grads)
# [end:pmap]


# [start:shard_map]
def dp_grads_shard_map(params, x, y, mesh):
    # params P(): replicated; x, y P(AXIS): rows split over devices
    f = jax.shard_map(dp_grads_body, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS)),
                      out_specs=P())
    return jax.jit(f)(params, x, y)


def dp_grads_of_shard_map(params, x, y, mesh):
    # The other fix: the loss is the pmean of per-device losses, and jax.grad
    # differentiates through shard_map (the transpose of the implicit
    # invariant-to-varying cast sums the per-device gradients).
    loss = jax.shard_map(lambda p, xb, yb: lax.pmean(mse(p, xb, yb), AXIS),
                         mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS)), out_specs=P())
    return jax.jit(jax.grad(loss))(params, x, y)
# [end:shard_map]


# [start:jit]
def dp_grads_program(params, x, y):
    # The global program: jax.grad of the full-batch loss. With x and y
    # sharded, jit computes per-device partial gradients and all-reduces them.
    return jax.grad(mse)(params, x, y)


def dp_grads_jit(params, x, y, mesh):
    rows = NamedSharding(mesh, P(AXIS))
    replicated = NamedSharding(mesh, P())
    f = jax.jit(dp_grads_program, in_shardings=(replicated, rows, rows),
                out_shardings=replicated)
    return f(params, x, y)
# [end:jit]


# [start:explicit]
def dp_grads_explicit_program(params, x, y, axis=AXIS, deferred=True):
    # The types say where the sum happens: x: f32[b@i, d], params["w"]:
    # f32[d, o] (replicated). The whole batch is one microbatch of the
    # programs below. deferred (JAX >= 0.9.1): params typed reduced over
    # `axis`, the gradient unreduced until one reshard sums it. Else
    # jax.grad of replicated params: a cotangent has its primal's type, so
    # the gradient of w is f32[d, o], replicated too, and jax.grad itself
    # sums the per-device partial gradients over `axis`, as in
    # dp_grads_program. Either way one all-reduce, as the jit form's.
    if deferred:
        return dp_grads_deferred_program(params, x[None], y[None], axis)
    return dp_grads_microbatches_program(params, x[None], y[None])


def dp_grads_explicit(params, x, y, mesh):
    # mesh: Explicit axes
    with jax.set_mesh(mesh):
        params = jax.sharding.reshard(params, P())
        x, y = jax.sharding.reshard((x, y), P(AXIS))
        deferred = jax.__version_info__[:3] >= DEFERRED_SUM_SINCE
        return jax.jit(functools.partial(dp_grads_explicit_program,
                                         deferred=deferred))(params, x, y)


def mse_of_reduced_params(params, x, y):
    # mse with params typed reduced over the rows' axis: x @ w takes them as
    # they are; the bias, broadcast to every row, is resharded to the rows'
    # split first (JAX does not add a reduced value to a sharded one)
    rows = jax.typeof(y).sharding.spec
    bias = jax.sharding.reshard(jnp.broadcast_to(params["b"][None], y.shape), rows)
    return jnp.mean((x @ params["w"] + bias - y) ** 2)


def dp_grads_microbatches_program(params, xs, ys):
    # xs: f32[m, b@i, d], ys: f32[m, b@i, o]: m microbatches. Each gradient
    # is replicated, so each is summed over i as it is taken: m all-reduces
    # (XLA may combine them into one of m gradients' size).
    grads = [jax.grad(mse)(params, xs[k], ys[k]) for k in range(len(xs))]
    return jax.tree_util.tree_map(lambda *g: sum(g) / len(g), *grads)


def dp_grads_deferred_program(params, xs, ys, axis=AXIS):
    # The same, with the sum over `axis` deferred: params resharded to
    # "reduced" over it, w: f32[d, o]{R:i} (replicated, and the gradient may
    # stay a per-device partial sum), so each gradient comes back unreduced,
    # f32[d, o]{U:i}: this device's rows' share, not yet summed. Adding the
    # microbatches' shares needs no communication; one reshard to P() sums
    # them over `axis`: one all-reduce of one gradient's size.
    names = {axis} if isinstance(axis, str) else set(axis)  # a name, or a tuple
    held = jax.tree_util.tree_map(
        lambda p: jax.sharding.reshard(p, P(*[None] * p.ndim, reduced=names)),
        params)
    shares = [jax.grad(mse_of_reduced_params)(held, xs[k], ys[k])
              for k in range(len(xs))]
    total = shares[0]
    for share in shares[1:]:  # still {U:i}: no communication
        total = jax.tree_util.tree_map(jnp.add, total, share)
    return jax.tree_util.tree_map(
        lambda g: jax.sharding.reshard(g, P()) / len(shares), total)


def dp_grads_microbatches_explicit(params, xs, ys, mesh, deferred=True):
    # mesh: Explicit axes; xs, ys: [m, batch, ...], each microbatch's rows
    # split over AXIS
    program = dp_grads_deferred_program if deferred else dp_grads_microbatches_program
    with jax.set_mesh(mesh):
        params = jax.sharding.reshard(params, P())
        xs, ys = jax.sharding.reshard((xs, ys), P(None, AXIS))
        return jax.jit(program)(params, xs, ys)
# [end:explicit]


# [start:numpy]
def dp_grads_numpy(params, x, y):
    # d/dw mean(r**2) = 2 x^T r / r.size, d/db = 2 sum_rows(r) / r.size, in
    # float64, rounded once to the parameters' dtype at the end
    w, b, x, y = (np.asarray(a, np.float64) for a in (params["w"], params["b"], x, y))
    residual = x @ w + b - y
    scale = 2.0 / residual.size
    return {"w": (scale * x.T @ residual).astype(params["w"].dtype),
            "b": (scale * residual.sum(0)).astype(params["b"].dtype)}
# [end:numpy]


def example(n_devices, rows_per_device=4, d=3, o=2, seed=0):
    # Integer values; batch * o = 8 * 4 * 2 = 64, a power of two: exact.
    rng = np.random.default_rng(seed)
    ints = lambda *shape: rng.integers(-4, 5, size=shape).astype(np.float32)
    batch = n_devices * rows_per_device
    return {"w": ints(d, o), "b": ints(o)}, ints(batch, d), ints(batch, o)


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_mesh(N_DEVICES)
    explicit_mesh = jax.make_mesh((N_DEVICES,), (AXIS,),
                                  axis_types=(jax.sharding.AxisType.Explicit,))
    params, x, y = example(N_DEVICES)
    xs, ys = (a.reshape(2, -1, a.shape[-1]) for a in (x, y))  # 2 microbatches
    want = dp_grads_numpy(params, x, y)
    results = {
        "pmap": dp_grads_pmap(params, x, y, N_DEVICES),
        "shard_map (pvary)": dp_grads_shard_map(params, x, y, mesh),
        "grad of shard_map": dp_grads_of_shard_map(params, x, y, mesh),
        "jit": dp_grads_jit(params, x, y, mesh),
        "explicit": dp_grads_explicit(params, x, y, explicit_mesh),
        "explicit, 2 microbatches": dp_grads_microbatches_explicit(
            params, xs, ys, explicit_mesh, deferred=False),
    }
    if jax.__version_info__[:3] >= DEFERRED_SUM_SINCE:
        results["explicit, 2 microbatches, one deferred sum"] = (
            dp_grads_microbatches_explicit(params, xs, ys, explicit_mesh))
    else:
        print(f"(the deferred sum needs JAX >= 0.9.1; this is {jax.__version__}: "
              "a reduce_sum of an unreduced value is refused there)")
    for form, grads in results.items():
        for name in ("w", "b"):
            np.testing.assert_array_equal(np.asarray(grads[name]), want[name],
                                          err_msg=f"d{name} ({form} form)")
    print(f"batch {x.shape[0]} rows over {N_DEVICES} devices, w {params['w'].shape}, "
          f"b {params['b'].shape}")
    print("dw =", want["w"].tolist())
    print("db =", want["b"].tolist())
    residual = x @ params["w"] + params["b"] - y  # [batch, o], exact integers
    print("by hand, db = 2 * (column sums of x @ w + b - y) / (batch * o) =",
          (2 * residual.sum(0) / residual.size).tolist())
    print("ok: pmap, both shard_map forms, jit and explicit (one batch; two "
          "microbatches, summed each or once) equal the NumPy gradient exactly")


if __name__ == "__main__":
    main()
