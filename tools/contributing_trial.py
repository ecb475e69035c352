"""CONTRIBUTING.md's "Adding a recipe", followed to the letter in a copy of
the repository: two throwaway recipes of each family (core, pattern,
strategy, kernel), each added by the steps that section lists and nothing
else.

``python tools/contributing_trial.py DEST`` makes the copy at ``DEST`` and
prints the recipe files' names (``recipes/<name>.py``; each recipe is
``throwaway_<name>``); CI runs the whole suite, the documentation build
(warnings as errors) and the browser check there, and
``tests/test_contributing.py`` runs ``list``, ``check``, ``show``, the
gallery, the bench and the registry-driven suite on the recipes. A step that
CONTRIBUTING.md no longer names stops the trial: the steps and this file
change together.
"""

from __future__ import annotations

import argparse
import shutil
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SKELETON = '''
    """{title}

    Registered as: ``collectives.RECIPES["{name}"]``.
    Devices: 8 (simulated on CPU by ``main()``).
    JAX versions checked: the one the suite runs.
    """

    import os

    import jax
    {jnp}import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P


    # [start:body]
    {body}
    # [end:body]


    # [start:pmap]
    def {stem}_pmap({args}, n):
        body = jax.pmap({stem}_body, axis_name="i", in_axes={pmap_in_axes})
        out = np.asarray(body({pmap_args}))
        return {pmap_out}
    # [end:pmap]


    # [start:shard_map]
    def {stem}_shard_map({args}, mesh):
        body = jax.shard_map({stem}_body, mesh=mesh,
                             in_specs={in_specs}, out_specs={out_spec})
        return jax.jit(body)({args})
    # [end:shard_map]


    # [start:jit]
    {program}


    def {stem}_jit({args}, mesh):
        shardings = tuple(NamedSharding(mesh, spec) for spec in {in_specs})
        return jax.jit(lambda {args}: {stem}_program({args}, mesh.shape["i"]),
                       in_shardings=shardings,
                       out_shardings=NamedSharding(mesh, {out_spec}))({args})
    # [end:jit]


    # [start:explicit]
    {explicit}


    def {stem}_explicit({args}, mesh):
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
            jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
        with jax.set_mesh(mesh):
            placed = [jax.device_put(a, s)
                      for a, s in zip(({args},), {in_specs}, strict=True)]
            return jax.jit(lambda *a: jax.sharding.reshard(
                {stem}_explicit_program(*a, mesh.shape["i"]), {out_spec}))(*placed)
    # [end:explicit]


    # [start:numpy]
    {numpy}
    # [end:numpy]


    def main():
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
        jax.config.update("jax_num_cpu_devices", 8)
        mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
        {inputs}
        want = {stem}_numpy({args}, 8)
        forms = ({stem}_pmap, {stem}_shard_map,
                 {stem}_jit, {stem}_explicit)
        for form, where in zip(forms, (8, mesh, mesh, mesh), strict=True):
            np.testing.assert_array_equal(np.asarray(form({args}, where)), want)
        print("result:", np.asarray(want).ravel()[:4].tolist())
        print("ok: every form agrees with NumPy")


    if __name__ == "__main__":
        main()
'''


def _title(text):
    """A docstring's first paragraph, wrapped as the skeleton indents it."""
    return textwrap.fill(text, 76).replace("\n", "\n    ")


def _recipe_file(**fields):
    # each field's continuation lines take the indentation of where it goes
    stem, args = fields["stem"], fields["args"]
    fields.setdefault("explicit", f"""
        def {stem}_explicit_program({args}, n):
            # the jit form's program, right as it is on Explicit axes
            return {stem}_program({args}, n)""")
    fields["title"] = _title(fields["title"])
    code = "".join(fields[key] for key in ("body", "program", "explicit", "numpy"))
    fields["jnp"] = "import jax.numpy as jnp\n    " if "jnp." in code else ""
    for key, indent in (("body", 4), ("program", 4), ("explicit", 4), ("numpy", 4),
                        ("inputs", 8)):
        fields[key] = textwrap.dedent(fields[key]).strip().replace(
            "\n", "\n" + " " * indent)
    return textwrap.dedent(_SKELETON.format(**fields))


# -- one recipe of each family ----------------------------------------------------

CORE = dict(
    stem="double_psum", name="throwaway_double_psum", args="x",
    title="Twice the psum: a core recipe added as CONTRIBUTING.md says.",
    body='''
        def double_psum_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m], the same on every device
            return 2 * lax.psum(x, axis)''',
    program='''
        def double_psum_program(x, n):
            return 2 * x.reshape(n, -1, *x.shape[1:]).sum(0, dtype=x.dtype)''',
    numpy='''
        def double_psum_numpy(x, n):
            wide = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
            return (2 * wide.sum(0)).astype(x.dtype)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the sum",
    in_specs='(P("i"),)', out_spec="P()",
    inputs="x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")

PATTERN = dict(
    stem="centre", name="throwaway_centre", args="x",
    title="Each block minus the mean block: a pattern added as CONTRIBUTING.md says.",
    body='''
        def centre_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m]: x minus the mean over devices
            return x - lax.pmean(x, axis)''',
    program='''
        def centre_program(x, n):
            blocks = x.reshape(n, -1, *x.shape[1:])
            return (blocks - blocks.mean(0, keepdims=True)).reshape(x.shape)''',
    numpy='''
        def centre_numpy(x, n):
            blocks = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
            centred = blocks - blocks.mean(0, keepdims=True)
            return centred.reshape(x.shape).astype(x.dtype)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out.reshape(-1, *out.shape[2:])  # the blocks, in device order",
    in_specs='(P("i"),)', out_spec='P("i")',
    inputs="x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")

STRATEGY = dict(
    stem="dp_square", name="throwaway_dp_square", args="w, x",
    title="Data-parallel gradient of 0.5 |x @ w|^2: a strategy added as "
          "CONTRIBUTING.md says.",
    body='''
        def dp_square_body(w, x, axis="i"):
            # w: [m] replicated, x: [k, m] rows of the batch -> [m], the
            # gradient of the whole batch's loss on every device
            return lax.psum(x.T @ (x @ w), axis)''',
    program='''
        def dp_square_program(w, x, n):
            return x.T @ (x @ w)''',
    explicit='''
        def dp_square_explicit_program(w, x, n):
            # x.T @ ... contracts the sharded rows: say where the sum lives
            return jnp.matmul(x.T, x @ w, out_sharding=P())''',
    numpy='''
        def dp_square_numpy(w, x, n):
            w64, x64 = np.asarray(w, np.float64), np.asarray(x, np.float64)
            return (x64.T @ (x64 @ w64)).astype(x.dtype)''',
    pmap_in_axes="(None, 0)", pmap_args="w, x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the gradient",
    in_specs='(P(), P("i"))', out_spec="P()",
    inputs="w = np.arange(3.0, dtype=np.float32)\n"
           "x = np.arange(24.0, dtype=np.float32).reshape(8, 3) % 5")

CORE_2 = dict(
    stem="max_abs", name="throwaway_max_abs", args="x",
    title="The largest magnitude over the devices: a core recipe added as "
          "CONTRIBUTING.md says.",
    body='''
        def max_abs_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m], the same on every device:
            # the largest |x| over the devices, element by element
            return lax.pmax(jnp.abs(x), axis)''',
    program='''
        def max_abs_program(x, n):
            return jnp.abs(x.reshape(n, -1, *x.shape[1:])).max(0)''',
    numpy='''
        def max_abs_numpy(x, n):
            # a cross-device max drops NaN: fmax, not max
            blocks = np.abs(np.asarray(x).reshape(n, -1, *x.shape[1:]))
            return np.fmax.reduce(blocks, 0)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the maximum",
    in_specs='(P("i"),)', out_spec="P()",
    inputs="x = (np.arange(16.0, dtype=np.float32) % 5 - 2).reshape(8, 2)")

PATTERN_2 = dict(
    stem="weighted_sum", name="throwaway_weighted_sum", args="x",
    title="Each block weighted by its device's place, summed: a pattern added "
          "as CONTRIBUTING.md says.",
    body='''
        def weighted_sum_body(x, axis="i"):
            # x: [k, m] on each device -> [k, m], the same on every device:
            # the sum over devices d of (d + 1) * block d
            weight = (lax.axis_index(axis) + 1).astype(x.dtype)
            return lax.psum(weight * x, axis)''',
    program='''
        def weighted_sum_program(x, n):
            blocks = x.reshape(n, -1, *x.shape[1:])
            weights = jnp.arange(1, n + 1, dtype=x.dtype).reshape(
                n, *(1,) * (blocks.ndim - 1))
            return (weights * blocks).sum(0, dtype=x.dtype)''',
    numpy='''
        def weighted_sum_numpy(x, n):
            blocks = np.asarray(x, np.float64).reshape(n, -1, *x.shape[1:])
            weights = np.arange(1, n + 1).reshape(n, *(1,) * (blocks.ndim - 1))
            return (weights * blocks).sum(0).astype(x.dtype)''',
    pmap_in_axes="0", pmap_args="x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the sum",
    in_specs='(P("i"),)', out_spec="P()",
    inputs="x = np.arange(16.0, dtype=np.float32).reshape(8, 2)")

STRATEGY_2 = dict(
    stem="dp_mean_square", name="throwaway_dp_mean_square", args="w, x",
    title="Data-parallel mean gradient of 0.5 |x @ w|^2 over the devices: a "
          "strategy added as CONTRIBUTING.md says.",
    body='''
        def dp_mean_square_body(w, x, axis="i"):
            # w: [m] replicated, x: [k, m] rows of the batch -> [m], the mean
            # over devices of each device's gradient, on every device
            return lax.pmean(x.T @ (x @ w), axis)''',
    program='''
        def dp_mean_square_program(w, x, n):
            return x.T @ (x @ w) / n''',
    explicit='''
        def dp_mean_square_explicit_program(w, x, n):
            # x.T @ ... contracts the sharded rows: say where the sum lives
            return jnp.matmul(x.T, x @ w, out_sharding=P()) / n''',
    numpy='''
        def dp_mean_square_numpy(w, x, n):
            w64, x64 = np.asarray(w, np.float64), np.asarray(x, np.float64)
            return (x64.T @ (x64 @ w64) / n).astype(x.dtype)''',
    pmap_in_axes="(None, 0)", pmap_args="w, x.reshape(n, -1, *x.shape[1:])",
    pmap_out="out[0]  # replicated: every device holds the gradient",
    in_specs='(P(), P("i"))', out_spec="P()",
    inputs="w = np.arange(3.0, dtype=np.float32)\n"
           "x = np.arange(24.0, dtype=np.float32).reshape(8, 3) % 5")

FACTS = {
    "double_psum": '''
        """The facts of recipes/double_psum.py."""
        from jax import lax

        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._layout import rows_replicated
        from collectives._presentation import BenchSpec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import double_psum as file

        register(Recipe(
            name="throwaway_double_psum", family="core",
            summary="2 * psum, a recipe added in a test",
            recipe_file="double_psum.py", body=file.double_psum_body,
            program=by_axis_size(file.double_psum_program),
            explicit_program=by_axis_size(file.double_psum_explicit_program),
            oracle=by_axis_size(file.double_psum_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
            example_shapes=one_grid, n_terms=lambda axes: axes.size + 1,
            dtype_kinds=frozenset({"float"}),
            cost_model=one_collective("all-reduce"),
            bench=BenchSpec(lambda x, axis, n: 2 * lax.psum(x, axis),
                            "all-reduce")))
    ''',
    "centre": '''
        """The facts of recipes/centre.py."""
        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import centre as file

        register(Recipe(
            name="throwaway_centre", family="pattern",
            summary="each block minus the mean block, a recipe added in a test",
            recipe_file="centre.py", body=file.centre_body,
            program=by_axis_size(file.centre_program),
            explicit_program=by_axis_size(file.centre_explicit_program),
            oracle=by_axis_size(file.centre_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_on_axes,
            example_shapes=one_grid, n_terms=lambda axes: axes.size + 2,
            dtype_kinds=frozenset({"float"}), bitwise=False,
            cost_model=one_collective("all-reduce")))
    ''',
    "dp_square": '''
        """The facts of recipes/dp_square.py."""
        from collectives._costs import fixed
        from collectives._layout import by_axis_size
        from collectives._layout import make_spec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import dp_square as file

        register(Recipe(
            name="throwaway_dp_square", family="strategy",
            summary="data-parallel gradient of 0.5 |x w|^2, a recipe added in a test",
            recipe_file="dp_square.py", body=file.dp_square_body,
            program=by_axis_size(file.dp_square_program),
            explicit_program=by_axis_size(file.dp_square_explicit_program),
            oracle=by_axis_size(file.dp_square_numpy),
            in_specs=lambda axes: (make_spec(), make_spec(axes.entry)),
            out_specs=lambda axes: make_spec(), arg_names=("w", "x"),
            example_shapes=lambda axes, dims: ((dims[0],), (axes.size * 2, dims[0])),
            n_terms=lambda axes: 2 * axes.size + 8,
            dtype_kinds=frozenset({"float"}),
            exact_dtypes=frozenset({"float32", "float64"}),
            cost_model=fixed({"all-reduce": 1})))
    ''',
}

FACTS.update({
    "max_abs": '''
        """The facts of recipes/max_abs.py."""
        import jax.numpy as jnp
        from jax import lax

        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._layout import rows_replicated
        from collectives._presentation import BenchSpec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import max_abs as file

        register(Recipe(
            name="throwaway_max_abs", family="core",
            summary="pmax of |x|, a recipe added in a test",
            recipe_file="max_abs.py", body=file.max_abs_body,
            program=by_axis_size(file.max_abs_program),
            explicit_program=by_axis_size(file.max_abs_explicit_program),
            oracle=by_axis_size(file.max_abs_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
            example_shapes=one_grid, n_terms=lambda axes: 1,
            dtype_kinds=frozenset({"float"}),
            cost_model=one_collective("all-reduce"),
            bench=BenchSpec(lambda x, axis, n: lax.pmax(jnp.abs(x), axis),
                            "all-reduce")))
    ''',
    "weighted_sum": '''
        """The facts of recipes/weighted_sum.py."""
        from collectives._costs import one_collective
        from collectives._layout import by_axis_size
        from collectives._layout import one_grid
        from collectives._layout import one_input
        from collectives._layout import rows_on_axes
        from collectives._layout import rows_replicated
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import weighted_sum as file

        register(Recipe(
            name="throwaway_weighted_sum", family="pattern",
            summary="sum of (d + 1) * block d, a recipe added in a test",
            recipe_file="weighted_sum.py", body=file.weighted_sum_body,
            program=by_axis_size(file.weighted_sum_program),
            explicit_program=by_axis_size(file.weighted_sum_explicit_program),
            oracle=by_axis_size(file.weighted_sum_numpy),
            in_specs=one_input(rows_on_axes), out_specs=rows_replicated,
            example_shapes=one_grid, n_terms=lambda axes: 2 * axes.size + 1,
            dtype_kinds=frozenset({"float"}),
            cost_model=one_collective("all-reduce")))
    ''',
    "dp_mean_square": '''
        """The facts of recipes/dp_mean_square.py."""
        from collectives._costs import fixed
        from collectives._layout import by_axis_size
        from collectives._layout import make_spec
        from collectives._recipe import Recipe
        from collectives._registry import register
        from collectives.recipes import dp_mean_square as file

        register(Recipe(
            name="throwaway_dp_mean_square", family="strategy",
            summary="data-parallel mean gradient of 0.5 |x w|^2, a recipe added "
                    "in a test",
            recipe_file="dp_mean_square.py", body=file.dp_mean_square_body,
            program=by_axis_size(file.dp_mean_square_program),
            explicit_program=by_axis_size(file.dp_mean_square_explicit_program),
            oracle=by_axis_size(file.dp_mean_square_numpy),
            in_specs=lambda axes: (make_spec(), make_spec(axes.entry)),
            out_specs=lambda axes: make_spec(), arg_names=("w", "x"),
            example_shapes=lambda axes, dims: ((dims[0],), (axes.size * 2, dims[0])),
            n_terms=lambda axes: 2 * axes.size + 9,
            dtype_kinds=frozenset({"float"}),
            exact_dtypes=frozenset({"float32", "float64"}),
            cost_model=fixed({"all-reduce": 1})))
    ''',
})

DIAGRAM = '''
    """What recipes/{stem}.py does: the collectives of its compiled
    shard_map form, one row each."""
    import dataclasses

    import numpy as np

    import collectives as cx
    from collectives import _figure
    from collectives.hlo import collective_stats

    CAPTION = "The gradient's all-reduce over the data axis."


    @dataclasses.dataclass(frozen=True)
    class Trace:
        kinds: tuple[str, ...]
        loss_grad: np.ndarray


    def trace(n_devices=8):
        recipe = cx.RECIPES["{name}"]
        mesh = cx.make_mesh((n_devices,), "i")
        axes = recipe.axes(mesh)
        args = recipe.example_args(mesh, exact=True)
        stats = collective_stats(recipe.compiled("shard_map", axes),
                                 *recipe.place(*args, axes=axes))
        return Trace(tuple(op.kind for op in stats.ops),
                     np.asarray(recipe.shard_map(*args, mesh=mesh)))


    def text(record):
        return "\\n".join(f"step {{i}}: {{kind}}"
                           for i, kind in enumerate(record.kinds))


    def draw(record, path, width="wide"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.0 if width == "wide" else 3.4, 1.4))
        ax.axis("off")
        for i, kind in enumerate(record.kinds):
            ax.text(0.02, 0.75 - 0.3 * i, f"step {{i}}: {{kind}}",
                    fontsize=_figure.font_pt(width, 11), transform=ax.transAxes)
        _figure.save(fig, path)
        plt.close(fig)
'''

STRATEGY_NAMES = {"dp_square": "throwaway_dp_square",
                  "dp_mean_square": "throwaway_dp_mean_square"}


# -- two kernels: the ring shift by +1 and by -1 as one remote DMA each ---------

KERNEL_SKELETON = '''
    """{title}

    The ring shift by {shift:+d} of ``ppermute.py``, written as a Pallas TPU
    kernel: each device sends its whole block with one remote DMA into the
    output of the device {shift:+d} along the axis, after a barrier with its two
    neighbours. Pallas's TPU interpret mode runs it on the CPU (JAX 0.10.2
    or newer).

    Registered as: ``collectives.RECIPES["{name}"]``.
    Devices: 8 (simulated on CPU by ``main()``).
    JAX versions checked: the one the suite runs (0.10.2 or newer).
    """

    import os

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    SHIFT = {shift}


    def interpret_mode():
        # A TPU compiles the kernel; elsewhere interpret mode simulates the TPU.
        return False if jax.default_backend() == "tpu" else pltpu.InterpretParams()


    # [start:body]
    def {stem}_body(x, axis="i"):
        # x: [k, m] on each device -> [k, m], the block of device me - SHIFT
        n = lax.axis_size(axis)

        def kernel(x_ref, out_ref, send_sem, recv_sem):
            me = lax.axis_index(axis)
            right = lax.rem(me + SHIFT + n, n)
            left = lax.rem(me - SHIFT + n, n)
            # both neighbours are in the kernel: their buffers exist
            barrier = pltpu.get_barrier_semaphore()
            pl.semaphore_signal(barrier, 1, device_id={{axis: left}})
            pl.semaphore_signal(barrier, 1, device_id={{axis: right}})
            pl.semaphore_wait(barrier, 2)
            dma = pltpu.make_async_remote_copy(x_ref, out_ref, send_sem, recv_sem,
                                               device_id={{axis: right}})
            dma.start()
            dma.wait()  # sent, and the left neighbour's block received

        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA] * 2,
            compiler_params=pltpu.CompilerParams(collective_id=0),
            interpret=interpret_mode(),
        )(x)
    # [end:body]


    # [start:pmap]
    # No pmap form: the kernel addresses its peers by mesh coordinates.
    # [end:pmap]


    # [start:shard_map]
    def {stem}_shard_map(x, mesh):
        return jax.jit(jax.shard_map({stem}_body, mesh=mesh, in_specs=P("i"),
                                     out_specs=P("i"), check_vma=False))(x)
    # [end:shard_map]


    # [start:jit]
    def {stem}_program(x, n):
        # a roll by whole blocks: a collective-permute
        return jnp.roll(x, SHIFT * (x.shape[0] // n), axis=0)


    def {stem}_jit(x, mesh):
        rows = NamedSharding(mesh, P("i"))
        return jax.jit(lambda x: {stem}_program(x, mesh.shape["i"]),
                       in_shardings=rows, out_shardings=rows)(x)
    # [end:jit]


    # [start:explicit]
    def {stem}_explicit_program(x, n):
        # a roll of a sharded dim has no sharding rule on Explicit axes:
        # auto_axes hands it to the partitioner
        return jax.sharding.auto_axes(lambda x: {stem}_program(x, n),
                                      out_sharding=jax.typeof(x).sharding)(x)


    def {stem}_explicit(x, mesh):
        mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(
            jax.sharding.AxisType.Explicit,) * len(mesh.axis_names))
        with jax.set_mesh(mesh):
            x = jax.device_put(x, P("i"))
            return jax.jit(lambda x: jax.sharding.reshard(
                {stem}_explicit_program(x, mesh.shape["i"]), P("i")))(x)
    # [end:explicit]


    # [start:numpy]
    def {stem}_numpy(x, n):
        return np.roll(x, SHIFT * (x.shape[0] // n), axis=0)
    # [end:numpy]


    def main():
        os.environ.setdefault("PJRT_NPROC", "16")  # threads for interpret mode
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
        jax.config.update("jax_num_cpu_devices", 8)
        if jax.__version_info__[:3] < (0, 10, 2):
            print("ok: nothing to compare (interpret mode needs JAX 0.10.2)")
            return
        mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
        x = np.arange(8 * 4 * 128, dtype=np.float32).reshape(32, 128)
        want = {stem}_numpy(x, 8)
        forms = ({stem}_shard_map, {stem}_jit,
                 {stem}_explicit)
        for form in forms:
            np.testing.assert_array_equal(np.asarray(form(x, mesh)), want)
        print("device 1's block starts", want[4, :3].tolist())
        print("ok: the kernel, jit and explicit agree with NumPy")


    if __name__ == "__main__":
        main()
'''

KERNEL_FACTS = '''
    """The facts of recipes/{stem}.py: the ring shift by {shift:+d} as one remote
    DMA per device."""
    from collectives._costs import block_bytes
    from collectives._facts import ppermute as _ppermute
    from collectives._facts._kernel import DmaCost
    from collectives._facts._kernel import kernel_recipe
    from collectives._layout import by_axis_size
    from collectives.recipes import {stem} as file


    def dma_cost(axes, args):
        """One step: every device sends its one block."""
        (x,) = args
        return DmaCost(steps=1, bytes_per_step=block_bytes(axes, x))


    {stem} = kernel_recipe(
        _ppermute.ppermute_ring, name="{name}",
        summary="ring shift by {shift:+d} as a Pallas kernel, a recipe added in a test",
        body=file.{stem}_body, recipe_file="{stem}.py",
        program=by_axis_size(file.{stem}_program),
        explicit_program=by_axis_size(file.{stem}_explicit_program),
        oracle=by_axis_size(file.{stem}_numpy))
'''

KERNEL_TEST = '''
    """``{name}``: the kernel of ``recipes/{stem}.py``
    against NumPy, bit for bit, with interpret mode's race detector on in both
    DMA modes."""

    import functools

    import numpy as np

    import collectives as cx
    from collectives.recipes import {stem} as file
    from helpers import KERNEL_MODES
    from helpers import kernel_module_marks
    from helpers import over_kernel_meshes
    from helpers import run_kernel_detected

    pytestmark = kernel_module_marks()


    @over_kernel_meshes
    def test_the_shift_matches_numpy_bit_for_bit(shape, names, axis):
        mesh = cx.make_mesh(shape, names)
        kernel = cx.RECIPES["{name}"]
        (x,) = kernel.example_args(mesh, axis, exact=True)
        want = file.{stem}_numpy(x, mesh.shape[axis])
        (spec,) = kernel.in_specs(kernel.axes(mesh, axis))
        body = functools.partial(file.{stem}_body, axis=axis)
        for mode in KERNEL_MODES:
            got = run_kernel_detected(body, x, mesh, spec, spec, mode)
            np.testing.assert_array_equal(got, want, err_msg=mode)
'''

LAW_TEST = '''
    """{doc}"""

    {imports}import numpy as np

    import collectives as cx
    from helpers import load_recipe

    file = load_recipe("{stem}")


    def test_{test}():
        mesh = cx.make_mesh((8,), ("i",))
        {body}
'''
"""Step 6's test module of a recipe: its law, ``{body}`` indented 4."""

LAWS = {
    "double_psum": ("twice the sum of the blocks, by hand",
                    "twice_the_sum_of_the_blocks", """
        x = np.arange(16.0, dtype=np.float32).reshape(8, 2)  # device d: [2d, 2d+1]
        got = file.double_psum_shard_map(x, mesh)
        np.testing.assert_array_equal(np.asarray(got), [[112.0, 128.0]])"""),
    "max_abs": ("a block's sign does not change the largest magnitude",
                "a_blocks_sign_does_not_matter", """
        x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        got = np.asarray(file.max_abs_shard_map(x, mesh))
        np.testing.assert_array_equal(got, np.asarray(file.max_abs_shard_map(-x, mesh)))
        np.testing.assert_array_equal(got[0], np.abs(x).max(0))"""),
    "centre": ("the centred blocks sum to zero over the devices",
               "the_centred_blocks_sum_to_zero", """
        x = np.arange(16.0, dtype=np.float32).reshape(8, 2) ** 2
        got = np.asarray(file.centre_shard_map(x, mesh))
        np.testing.assert_allclose(got.sum(0), 0.0, atol=1e-4)"""),
    "weighted_sum": ("equal blocks c sum to (1 + 2 + ... + 8) c = 36 c",
                     "equal_blocks_sum_to_36_times_one", """
        x = np.full((8, 2), 3.0, np.float32)
        got = file.weighted_sum_shard_map(x, mesh)
        np.testing.assert_array_equal(np.asarray(got), [[108.0, 108.0]])"""),
    "dp_square": ("the gradient jax.grad takes of the whole batch on one device",
                  "the_gradient_of_the_whole_batch", """
        w = np.arange(3.0, dtype=np.float32)
        x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
        want = jax.grad(lambda w: 0.5 * jnp.sum((x @ w) ** 2))(w)
        np.testing.assert_allclose(np.asarray(file.dp_square_shard_map(w, x, mesh)),
                                   want, rtol=1e-5)"""),
    "dp_mean_square": ("8 devices' mean of their gradients is an eighth of the "
                       "whole batch's", "an_eighth_of_the_whole_batchs_gradient", """
        w = np.arange(3.0, dtype=np.float32)
        x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
        want = jax.grad(lambda w: 0.5 * jnp.sum((x @ w) ** 2))(w) / 8
        got = file.dp_mean_square_shard_map(w, x, mesh)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)"""),
}
"""Each lax recipe's law, for its test module: (what it says, the test's
name, its body)."""

KERNELS = {"kernel_shift_up": 1, "kernel_shift_down": -1}
KERNEL_BUG = ("right = lax.rem(me + SHIFT + n, n)", "right = me", "wrong values")
"""The bug each kernel gets in tests/test_kernel_bugs.py: its block sent to
itself."""

LAX_RECIPES = {"double_psum": CORE, "max_abs": CORE_2, "centre": PATTERN,
               "weighted_sum": PATTERN_2, "dp_square": STRATEGY,
               "dp_mean_square": STRATEGY_2}
NAMES = [*(fields["name"] for fields in LAX_RECIPES.values()),
         *(f"throwaway_{stem}" for stem in KERNELS)]
STEMS = [*LAX_RECIPES, *KERNELS]
FAMILIES = {"core": ("double_psum", "max_abs"), "pattern": ("centre", "weighted_sum"),
            "strategy": ("dp_square", "dp_mean_square"),
            "kernel": tuple(KERNELS)}

_NOT_COPIED = shutil.ignore_patterns(
    ".git", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache", ".tox",
    "*.egg-info", "_build", "_generated", ".venv")


def _step(steps: str, words: str) -> None:
    """Stop where CONTRIBUTING.md no longer says ``words``."""
    if words not in steps:
        raise SystemExit(f"CONTRIBUTING.md no longer says {words!r}: "
                         "update tools/contributing_trial.py with its steps")


def _write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip("\n"))


def build(dest: Path, source: Path = ROOT) -> Path:
    """A copy of ``source`` at ``dest`` with the eight recipes added as
    CONTRIBUTING.md's "Adding a recipe" says, step by step, and nothing else."""
    dest = Path(dest)
    shutil.copytree(source, dest, symlinks=True, ignore=_NOT_COPIED)
    steps = (source / "CONTRIBUTING.md").read_text()
    # Step 1, the recipe file; step 2, its facts module, named alike.
    _step(steps, "recipes/<file>.py")
    _step(steps, "collectives/_facts/<file>.py")
    for stem, fields in LAX_RECIPES.items():
        (dest / "recipes" / f"{stem}.py").write_text(_recipe_file(**dict(fields)))
        _write(dest / "collectives" / "_facts" / f"{stem}.py", FACTS[stem])
    # Step 3, a core recipe: its name joins the README's contract.
    _step(steps, "README's **Core recipes** bullet")
    readme = dest / "README.md"
    core = ", ".join(f"`{LAX_RECIPES[stem]['name']}`" for stem in FAMILIES["core"])
    text = readme.read_text()
    at = text.index("- **Core recipes**")
    bullet = text[at:].split("\n- ")[0]
    assert "`axis_index` — each" in bullet, bullet
    bullet, rest = text[at:at + len(bullet)], text[at + len(bullet):]
    readme.write_text(text[:at] + bullet.replace(
        "`axis_index` — each", f"`axis_index`, {core} — each") + rest)
    # Step 4, a strategy: its diagram, named like its recipe file.
    _step(steps, "collectives/_strategy_diagrams/<file>.py")
    _step(steps, "collectives._figure.save(fig, path)")
    for stem, name in STRATEGY_NAMES.items():
        _write(dest / "collectives" / "_strategy_diagrams" / f"{stem}.py",
               DIAGRAM.format(stem=stem, name=name))
    # Step 5, a kernel: the file, its facts (kernel_recipe, a dma_cost), its
    # test module and a planted bug.
    _step(steps, "kernel_recipe(native, ...)")
    _step(steps, "tests/test_kernel_<name>.py")
    _step(steps, "tests/test_kernel_bugs.py")
    bugs = dest / "tests" / "test_kernel_bugs.py"
    planted = bugs.read_text()
    assert planted.count("PLANTED = [\n") == 1
    for stem, shift in KERNELS.items():
        fields = dict(stem=stem, name=f"throwaway_{stem}", shift=shift,
                      title=_title(f"The ring shift by {shift:+d} as a Pallas "
                                   "kernel: a kernel recipe added as "
                                   "CONTRIBUTING.md says."))
        _write(dest / "recipes" / f"{stem}.py", KERNEL_SKELETON.format(**fields))
        _write(dest / "collectives" / "_facts" / f"{stem}.py",
               KERNEL_FACTS.format(**fields))
        _write(dest / "tests" / f"test_{stem}.py", KERNEL_TEST.format(**fields))
        old, new, found = KERNEL_BUG
        case = (f"    ({stem + '.py'!r}, 'its block sent to itself',\n"
                f"     {old!r}, {new!r}, ({found!r},)),\n")
        planted = planted.replace("PLANTED = [\n", "PLANTED = [\n" + case, 1)
    bugs.write_text(planted)
    # Step 6, its test module (the kernels' came with step 5).
    _step(steps, "**Its test module**, `tests/test_<file>.py`")
    for stem, (law, test, body) in LAWS.items():
        body = textwrap.dedent(body).strip().replace("\n", "\n" + " " * 8)
        doc = textwrap.fill(f"``recipes/{stem}.py``: {law} (every form against "
                            "the NumPy oracle: the registry-driven suites).", 72)
        imports = "".join(f"{line}\n    " for name, line in (
            ("jax.", "import jax"), ("jnp.", "import jax.numpy as jnp"))
            if name in body)
        _write(dest / "tests" / f"test_{stem}.py", LAW_TEST.format(
            stem=stem, doc=doc.replace("\n", "\n    "), test=test, body=body,
            imports=imports))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="where the copy goes (must not exist)")
    args = parser.parse_args(argv)
    if args.dest.exists():
        parser.error(f"dest: {args.dest} exists. Fix: name a path that does not")
    build(args.dest)
    print(" ".join(STEMS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
