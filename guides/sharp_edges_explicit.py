"""Sharp edges of Explicit mesh axes: shardings in the types, unreduced values.

What it shows, on a mesh whose axes are ``AxisType.Explicit`` (what
``jax.make_mesh`` gives by default from JAX 0.9), each as the wrong way (the
real error or the wrong number) and the fix:

  14. ``jnp.roll`` (or a slice) along a sharded dimension raises a
      ShardingTypeError ("slicing on sharded dims where out dim (1) is not
      divisible by mesh axes (8)"; from 0.11: "`a` cannot be sharded on the
      axis being rolled over"). Fix: ``jax.sharding.auto_axes(f,
      out_sharding=...)`` around it (the compiler picks the communication),
      or a shard_map island that says it (one ppermute).
  15. A dot whose contracting dimension is sharded on both sides raises:
      "Contracting dimensions are sharded and it is ambiguous how the output
      should be sharded". Fix: say it, ``jnp.matmul(a, b, out_sharding=P())``.
  16. ``lax.with_sharding_constraint`` is an assertion on Explicit axes:
      "AssertionError: `with_sharding_constraint` acts as an assert when all
      axes of mesh are of type `Explicit`". Fix: ``jax.sharding.reshard``.
  17. On JAX 0.8.0 and 0.8.1, ``reshard(x, P(unreduced={"i"}))`` copies the
      whole of ``x`` to every device instead of splitting it into pieces that
      sum to ``x``, so the reshard back to ``P()`` returns ``n * x``, silently.
      Fix: reshard to ``P()`` directly; take partial sums from the op that
      makes them (``jnp.matmul(..., out_sharding=P(unreduced={"i"}))``), which
      is right on every release.
  18. An unreduced array returned from jit keeps its type (``P(None, None,
      unreduced={'i'})``); reading it on the host returns device 0's partial
      sum, silently, up to JAX 0.10.0, and raises from 0.10.1
      (NotImplementedError "device_indices_map doesn't work with unreduced";
      0.12.0.1: JaxRuntimeError "Unreduced sharding does not support
      UniqueIndexDomains"; 0.12.1: RuntimeError "Fetching value for
      `jax.Array` that is unreduced is not allowed"). Fix: reshard to
      ``P()`` before returning.
  19. A shard_map manual over one axis of a 2-D mesh (``axis_names={"X"}``,
      ``"Y"`` left to the compiler), whose input is sharded over both
      (``f32[8@X, 8@Y]``), all-gathers ``"Y"`` before the body on JAX 0.10.1
      to 0.11.1: the compiled program has an all-gather over ``"Y"`` and an
      all-reduce of twice the bytes, silently (other releases: the one
      all-reduce). Fix: make the shard_map manual over both axes
      (``in_specs=P("X", "Y")``), or the jit form.
  20. After a global ``jax.set_mesh(mesh)``, a shard_map over another mesh
      raises: "ValueError: The context mesh ... should match the mesh passed
      to shard_map" (every release; ``jax.pmap`` too). Fix: ``with
      jax.set_mesh(other):`` around the call (then ``mesh=`` may be left out).
  21. From JAX 0.12.1, a value unreduced over two axes (a gradient whose sum
      over the data axes ``("X", "Y")`` is deferred) is summed by
      ``reshard(g, P())`` one axis at a time: an all-reduce over ``"Y"``,
      then one over ``"X"``, 2.5 times the gradient's bytes per device where
      one all-reduce over both sends 1.75 times. Fix: sum it in a shard_map,
      ``lax.psum(g, ("X", "Y"))`` with ``in_specs=P(unreduced={"X", "Y"})``:
      one all-reduce on every release.

Which form when: the explicit form is the jit form with the shardings in the
types, so every one of these is the compiler asking the program to say what
Auto axes let it guess; shard_map is the island where the per-device program
is written by hand; pmap has none of these types.

Devices: 8 (simulated on CPU by ``main()``).
JAX versions checked: 0.8.0, 0.8.1, 0.8.2, 0.9.2, 0.10.2, 0.12.0.1 (17 and 18
also 0.8.3, 0.9.0, 0.9.1, 0.10.0, 0.10.1, 0.11.2; 19 and 20 every release
0.8.0 to 0.12.0.1).
Run: ``python guides/sharp_edges_explicit.py``
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8


def make_explicit_mesh(shape, names):
    # What jax.make_mesh(shape, names) gives by default from JAX 0.9 on.
    return jax.make_mesh(shape, names,
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


# [start:pmap]
def matmul_pmap(a, b, n_devices):
    # The "before" of 15, 17 and 18: each device multiplies its k columns of a
    # by its k rows of b and psums the partial products.
    # a: [m, n*k], b: [n*k, p] -> [m, p]
    a_blocks = a.reshape(a.shape[0], n_devices, -1).transpose(1, 0, 2)  # [n, m, k]
    b_blocks = b.reshape(n_devices, -1, b.shape[1])  # [n, k, p]
    f = jax.pmap(lambda a, b: lax.psum(a @ b, "i"), axis_name="i")
    return np.asarray(f(a_blocks, b_blocks))[0]  # every device holds the sum
# [end:pmap]


# [start:shard_map]
def roll_shard_map(x, mesh):
    # Fix 14, as a shard_map island: x: f32[n*k] over "i"; device d receives
    # the last element of device d-1's block: one ppermute.
    n = mesh.shape["i"]

    def per_device(block):
        # block: f32[k] on each device
        carry = lax.ppermute(block[-1:], "i", [(d, (d + 1) % n) for d in range(n)])
        return jnp.concatenate([carry, block[:-1]])

    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(jax.shard_map(per_device, in_specs=P("i"),
                                     out_specs=P("i")))(x)


def sum_over_x_partial_manual(mesh):
    # Pitfall 19: manual over "X" only ("Y" stays the compiler's). On x:
    # f32[8@X, 8@Y] each "X" group's block is b: f32[2, 8@Y]; psum over "X".
    # JAX 0.10.1 to 0.11.1 all-gather "Y" first: the psum moves f32[2, 8].
    return jax.jit(jax.shard_map(lambda b: lax.psum(b, "X"), mesh=mesh,
                                 in_specs=P("X"), out_specs=P(),
                                 axis_names={"X"}))


def sum_over_x_fully_manual(mesh):
    # Fix 19: manual over both axes: b: f32[2, 4] on each device, the psum
    # over "X" moves f32[2, 4], and "Y" stays sharded on every release.
    return jax.jit(jax.shard_map(lambda b: lax.psum(b, "X"), mesh=mesh,
                                 in_specs=P("X", "Y"), out_specs=P(None, "Y")))


def total_shard_map(x, mesh):
    # Pitfall 20: a shard_map over `mesh`, run where the context mesh (a
    # global jax.set_mesh) is another one: ValueError before any tracing.
    # x: f32[16]; each device sums its 2 elements, the psum adds them up.
    axes = tuple(mesh.axis_names)
    f = jax.shard_map(lambda b: lax.psum(b.sum(keepdims=True), axes), mesh=mesh,
                      in_specs=P(axes), out_specs=P())
    return jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P(axes))))


def total_shard_map_scoped(x, mesh):
    # Fix 20: make `mesh` the context mesh for the call; the global one is
    # back after the with.
    with jax.set_mesh(mesh):
        return total_shard_map(x, mesh)


def total_shard_map_context_mesh(x, mesh):
    # Fix 20, without mesh=: shard_map takes the context mesh.
    axes = tuple(mesh.axis_names)
    with jax.set_mesh(mesh):
        f = jax.shard_map(lambda b: lax.psum(b.sum(keepdims=True), axes),
                          in_specs=P(axes), out_specs=P())
        return jax.jit(f)(jax.device_put(x, P(axes)))
# [end:shard_map]


# [start:jit]
def roll_plain(x, mesh):
    # Pitfall 14: x: f32[16@i]; rolling along the sharded dimension raises.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(lambda x: jnp.roll(x, 1))(x)


def roll_auto_axes(x, mesh):
    # Fix 14: inside auto_axes the axes are Auto again (the compiler chooses
    # the communication); out_sharding gives the result its Explicit type.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        roll = jax.sharding.auto_axes(lambda x: jnp.roll(x, 1), out_sharding=P("i"))
        return jax.jit(roll)(x)


def matmul_plain(a, b, mesh):
    # Pitfall 15: a: f32[m, 16@i] @ b: f32[16@i, p]: the output's sharding is
    # ambiguous (replicated? sharded? unreduced?), so the type check raises.
    with jax.set_mesh(mesh):
        a, b = jax.device_put(a, P(None, "i")), jax.device_put(b, P("i", None))
        return jax.jit(lambda a, b: a @ b)(a, b)


def matmul_out_sharding(a, b, mesh):
    # Fix 15: say where the result lives: P() is one all-reduce.
    with jax.set_mesh(mesh):
        a, b = jax.device_put(a, P(None, "i")), jax.device_put(b, P("i", None))
        return jax.jit(lambda a, b: jnp.matmul(a, b, out_sharding=P()))(a, b)


def constrain_plain(x, mesh):
    # Pitfall 16: on Explicit axes with_sharding_constraint only checks.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(lambda x: lax.with_sharding_constraint(2 * x, P()))(x)


def constrain_reshard(x, mesh):
    # Fix 16: reshard moves the data (an all-gather here) and changes the type.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(lambda x: jax.sharding.reshard(2 * x, P()))(x)


def unreduced_round_trip(x, mesh):
    # Pitfall 17: x: f32[16@i] -> unreduced (pieces that sum to x) -> P().
    # JAX 0.8.0 and 0.8.1 copy all of x to each device: the sum is n * x.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(lambda x: jax.sharding.reshard(
            jax.sharding.reshard(x, P(unreduced={"i"})), P()))(x)


def replicate_directly(x, mesh):
    # Fix 17: the round trip's value is x: reshard to P() directly.
    with jax.set_mesh(mesh):
        x = jax.device_put(x, P("i"))
        return jax.jit(lambda x: jax.sharding.reshard(x, P()))(x)


def partial_products_reduced(a, b, mesh):
    # Fix 17, when partial sums are what you want: the matmul makes them
    # (each device's a_block @ b_block, unreduced over "i"), and the reshard
    # to P() is the deferred all-reduce; right on every release.
    with jax.set_mesh(mesh):
        a, b = jax.device_put(a, P(None, "i")), jax.device_put(b, P("i", None))

        @jax.jit
        def f(a, b):
            partial = jnp.matmul(a, b, out_sharding=P(None, None, unreduced={"i"}))
            return jax.sharding.reshard(partial, P())

        return f(a, b)


def partial_products_returned(a, b, mesh):
    # Pitfall 18: the unreduced partial products leave jit as they are.
    with jax.set_mesh(mesh):
        a, b = jax.device_put(a, P(None, "i")), jax.device_put(b, P("i", None))
        return jax.jit(lambda a, b: jnp.matmul(
            a, b, out_sharding=P(None, None, unreduced={"i"})))(a, b)


DEFERRED_GRADIENT_SINCE = (0, 9, 1)  # before, a reduced parameter's grad raises


def grad_summed_by_reshard(mesh_2d):
    # Pitfall 21: w: f32[d, o], typed reduced over both axes; x: f32[b@(X,Y),
    # d]. The gradient of sum(x @ w) is unreduced over ("X", "Y"), and one
    # reshard to P() sums it: JAX 0.12.1 compiles one all-reduce per axis.
    # Call it, and place its inputs (deferred_inputs), inside
    # `with jax.set_mesh(mesh_2d)`.
    return _deferred_grad(lambda g: jax.sharding.reshard(g, P()))


def grad_summed_by_psum(mesh_2d):
    # Fix 21: the same sum said in a shard_map: one all-reduce over both axes.
    def psum_both(g):
        unreduced = P(*[None] * g.ndim, unreduced=set(mesh_2d.axis_names))
        return jax.shard_map(lambda g: lax.psum(g, mesh_2d.axis_names),
                             in_specs=unreduced, out_specs=P())(g)
    return _deferred_grad(psum_both)


def _deferred_grad(total):
    @jax.jit
    def f(w, x):
        names = set(jax.typeof(x).sharding.spec[0])  # the batch's axes
        held = jax.sharding.reshard(w, P(None, None, reduced=names))
        return total(jax.grad(lambda w: jnp.sum(x @ w))(held))
    return f


def deferred_inputs(w, x, mesh_2d):
    """w replicated, x's rows split over both axes of ``mesh_2d``."""
    return (jax.device_put(w, NamedSharding(mesh_2d, P())),
            jax.device_put(x, NamedSharding(mesh_2d, P(mesh_2d.axis_names))))


def sum_over_x_jit(mesh):
    # Fix 19 without shard_map: x: f32[8@X, 8@Y] -> [4@X, 2, 8@Y] -> sum over
    # the "X" blocks: one all-reduce of f32[2, 4], "Y" stays sharded.
    n = mesh.shape["X"]
    return jax.jit(lambda x: x.reshape(n, -1, x.shape[1]).sum(0))


def on_both_axes(fn, x, mesh):
    """Run ``fn`` (one of the ``sum_over_x_*`` programs) on x: f32[8@X, 8@Y]."""
    return fn(jax.device_put(x, NamedSharding(mesh, P("X", "Y"))))


def collectives_in(fn, x, mesh):
    """The collectives of ``fn``'s compiled program on x: f32[8@X, 8@Y], in
    order, as ``(kind, result shape)``: ``[("all-reduce", "f32[2,4]")]``."""
    placed = jax.device_put(x, NamedSharding(mesh, P("X", "Y")))
    text = fn.lower(placed).compile().as_text()
    found = []
    for line in text.splitlines():  # "%name = f32[2,4]{1,0} all-reduce(%x), ..."
        rest = line.partition(" = ")[2]
        for kind in ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                     "collective-permute"):
            for opcode in (f" {kind}(", f" {kind}-start("):  # -start: async
                if opcode in rest:
                    result = rest.split(opcode)[0].lstrip("(")  # a tuple if async
                    found.append((kind, result.split("{")[0]))
    return found
# [end:jit]


# [start:numpy]
def roll_numpy(x):
    return np.roll(x, 1)


def matmul_numpy(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def sum_over_x_numpy(x, n_x):
    # The sum of the n_x row blocks of x
    return x.reshape(n_x, -1, x.shape[1]).sum(0)
# [end:numpy]


def error_line(fn, *args, width=110):
    """The exception ``fn`` raises, as one line of at most ``width``
    characters of message; None when it runs."""
    try:
        np.asarray(fn(*args))
    except Exception as err:  # JAX's ShardingTypeError has no public name
        text = " ".join(str(err).split())
        return f"{type(err).__name__}: {text[:width]}"
    return None


def main():
    # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
    # names a platform.
    jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
    jax.config.update("jax_num_cpu_devices", N_DEVICES)
    mesh = make_explicit_mesh((N_DEVICES,), ("i",))
    print(f"JAX {jax.__version__}")

    x = np.arange(2.0 * N_DEVICES, dtype=np.float32)  # [16]
    print("14. jnp.roll along a sharded dim ->", error_line(roll_plain, x, mesh))
    for form, got in (("auto_axes", roll_auto_axes(x, mesh)),
                      ("shard_map", roll_shard_map(x, mesh))):
        np.testing.assert_array_equal(np.asarray(got), roll_numpy(x), err_msg=form)
    print("    auto_axes and shard_map ->", np.asarray(roll_numpy(x))[:4].tolist(),
          "...")

    a = np.arange(2.0 * x.size, dtype=np.float32).reshape(2, -1)  # [2, 16]
    b = np.ones((x.size, 3), dtype=np.float32)  # [16, 3]
    want = matmul_numpy(a, b)
    print("15. a @ b, contracting dim sharded ->", error_line(matmul_plain, a, b, mesh))
    for form, got in (("out_sharding=P()", matmul_out_sharding(a, b, mesh)),
                      ("pmap", matmul_pmap(a, b, N_DEVICES))):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=form)
    print("    out_sharding=P() ->", want[:, 0].tolist())

    print("16. with_sharding_constraint ->", error_line(constrain_plain, x, mesh))
    np.testing.assert_array_equal(np.asarray(constrain_reshard(x, mesh)), 2 * x)
    print("    reshard ->", np.asarray(constrain_reshard(x, mesh))[:4].tolist(), "...")

    got = np.asarray(unreduced_round_trip(x, mesh))
    print(f"17. reshard to unreduced and back -> {got[:4].tolist()} ... "
          f"(x is {x[:4].tolist()} ...)")
    assert np.array_equal(got, x) or np.array_equal(got, N_DEVICES * x), got
    np.testing.assert_array_equal(np.asarray(replicate_directly(x, mesh)), x)
    np.testing.assert_array_equal(np.asarray(partial_products_reduced(a, b, mesh)),
                                  want)
    print("    reshard to P() directly ->", np.asarray(x)[:4].tolist(),
          "...; partial products, then P() ->", want[:, 0].tolist())

    returned = partial_products_returned(a, b, mesh)
    print(f"18. unreduced out of jit: spec {returned.sharding.spec}; read ->",
          error_line(lambda: np.asarray(returned).tolist())
          or f"{np.asarray(returned)[:, 0].tolist()} (device 0's part; want "
          f"{want[:, 0].tolist()})")
    print("    reshard to P() before returning ->", want[:, 0].tolist())

    mesh_2d = make_explicit_mesh((4, 2), ("X", "Y"))
    y = np.arange(64.0, dtype=np.float32).reshape(8, 8)  # [8@X, 8@Y]
    want = sum_over_x_numpy(y, 4)
    partial = collectives_in(sum_over_x_partial_manual(mesh_2d), y, mesh_2d)
    if any(kind == "all-gather" for kind, _ in partial):
        note = "an all-gather of 'Y' first, then an all-reduce of twice the bytes"
    else:
        note = "no gather on this release; JAX 0.10.1 to 0.11.1 all-gather 'Y' first"
    print("19. shard_map(axis_names={'X'}) on f32[8@X, 8@Y] compiles to",
          partial, f"({note})")
    for program in (sum_over_x_partial_manual, sum_over_x_fully_manual,
                    sum_over_x_jit):
        got = on_both_axes(program(mesh_2d), y, mesh_2d)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=program.__name__)
        assert got.sharding.spec == P(None, "Y"), (program.__name__, got.sharding)
    for program in (sum_over_x_fully_manual, sum_over_x_jit):
        fixed = collectives_in(program(mesh_2d), y, mesh_2d)
        assert fixed == [("all-reduce", "f32[2,4]")], (program.__name__, fixed)
    print("    manual over both axes, or jit ->", fixed, "; column 0:",
          want[:, 0].tolist())

    jax.set_mesh(mesh)  # global, for the rest of the program
    print("20. after jax.set_mesh(mesh), a shard_map over a (4, 2) mesh ->",
          error_line(total_shard_map, x, mesh_2d, width=240))
    for fix in (total_shard_map_scoped, total_shard_map_context_mesh):
        np.testing.assert_array_equal(np.asarray(fix(x, mesh_2d)), [x.sum()],
                                      err_msg=fix.__name__)
    assert jax.sharding.get_abstract_mesh() == mesh.abstract_mesh
    print("    with jax.set_mesh(mesh_2d): ... ->", [float(x.sum())])

    if jax.__version_info__[:3] < DEFERRED_GRADIENT_SINCE:
        print("21. a gradient unreduced over two axes: JAX",
              jax.__version__, "refuses a reduce_sum of an unreduced value")
    else:
        w, rows = np.ones((5, 3), np.float32), y[:, :5]  # rows: [8@(X,Y), 5]
        with jax.set_mesh(mesh_2d):
            inputs = deferred_inputs(w, rows, mesh_2d)
            for label, program in (("21. a gradient unreduced over ('X', 'Y'), "
                                    "reshard to P() (one per axis from JAX 0.12.1) ->",
                                    grad_summed_by_reshard),
                                   ("    the same sum in a shard_map, psum ->",
                                    grad_summed_by_psum)):
                f = program(mesh_2d)
                np.testing.assert_array_equal(np.asarray(f(*inputs))[:, 0],
                                              rows.sum(0), err_msg=program.__name__)
                text = f.lower(*inputs).compile().as_text()
                count = text.count(" all-reduce(") + text.count(" all-reduce-start(")
                print(label, count, "all-reduce(s)")

    print("ok: every fix agrees with NumPy on Explicit axes (auto_axes, "
          "out_sharding, reshard, partial sums reduced before they leave jit, "
          "shard_maps manual over every sharded axis and run on their own mesh)")


if __name__ == "__main__":
    main()
