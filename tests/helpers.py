"""Shared helpers for the test suite."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES_DIR = ROOT / "recipes"
GUIDES_DIR = ROOT / "guides"


def _files(folder):
    return sorted(path for path in folder.glob("*.py") if path.name != "__init__.py")


RECIPE_FILES = _files(RECIPES_DIR)
"""Every recipe file: the files in recipes/, each the source of registered
recipes."""
GUIDE_FILES = _files(GUIDES_DIR)
"""Every guide file: the files in guides/, which hold no registered recipe."""
STANDALONE_FILES = sorted([*RECIPE_FILES, *GUIDE_FILES], key=lambda path: path.name)
"""Every standalone file, recipe or guide; tests/test_recipe_files.py runs
each."""


def standalone_file(stem):
    """``recipes/<stem>.py`` or ``guides/<stem>.py``, whichever there is."""
    for folder in (RECIPES_DIR, GUIDES_DIR):
        if (folder / f"{stem}.py").exists():
            return folder / f"{stem}.py"
    raise FileNotFoundError(f"no recipes/{stem}.py or guides/{stem}.py")


def runnable_configs(recipe):
    """``(mesh, axis)`` for each of ``check``'s mesh configurations that
    ``recipe`` runs on (its ``unsupported_reason`` passes), in ``check``'s order."""
    import collectives as cx
    from collectives._check import standard_configs

    configs = []
    for shape, names, axis in standard_configs():
        mesh = cx.make_mesh(shape, names)
        if recipe.unsupported_reason(recipe.axes(mesh, axis)) is None:
            configs.append((mesh, axis))
    assert configs, f"{recipe.name} runs on none of check's mesh configurations"
    return configs


def jit_form_replaced(change):
    """``check``'s ``forms=`` hook: the recipe's own forms, with the jit
    form's outputs passed through ``change`` (a wrong form to catch)."""
    import jax

    def forms_for(recipe, axes):
        forms = dict(recipe.bound_forms(axes))
        jit = forms["jit"]
        forms["jit"] = lambda *args: jax.tree_util.tree_map(change, jit(*args))
        return forms
    return forms_for


def run_python(*args, cwd=None, timeout=300, env=None, check=True, python=None):
    """Run ``python *args`` in a fresh process (``python``: another interpreter
    than this one); return the CompletedProcess."""
    import jax

    full_env = {**os.environ, **(env or {})}
    full_env.pop("JAX_NUM_CPU_DEVICES", None)
    # The platform the pytest plugin chose (cpu, so the simulated devices are
    # the ones used on a GPU machine too) holds in the child as well.
    if jax.config.jax_platforms and "JAX_PLATFORMS" not in full_env:
        full_env["JAX_PLATFORMS"] = jax.config.jax_platforms
    result = subprocess.run([python or sys.executable, *args], capture_output=True,
                            text=True, timeout=timeout, cwd=cwd, env=full_env)
    if check and result.returncode != 0:
        raise AssertionError(
            f"python {' '.join(map(str, args))} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")
    return result


def load_file(path, name):
    """Import the file ``path`` as the module ``name`` (for files outside any
    package: recipes/, tools/)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_recipe(stem):
    """Import ``recipes/<stem>.py`` or ``guides/<stem>.py`` as a module, as
    ``python`` runs it (the folder's package is not imported)."""
    return load_file(standalone_file(stem), f"recipe_{stem}")


def load_matrix():
    """``tools/jax_matrix.py``, the release matrix."""
    return load_file(ROOT / "tools" / "jax_matrix.py", "jax_matrix")


def examples(ci):
    """``ci`` hypothesis examples by default; the deep profile's count under it."""
    from hypothesis import settings

    if settings.get_current_profile_name() == "deep":
        return settings().max_examples
    return min(ci, settings().max_examples)


def assert_loss_and_grads_match(report, want_loss, want, *, rtol, atol):
    """Every JAX form's ``(loss, grads)`` in ``report`` equals the single-device
    ``jax.value_and_grad`` result within ``rtol``/``atol``."""
    from collectives.testing import compare_arrays

    for form in ("pmap", "shard_map", "jit"):
        loss, grads = report.results[form]
        assert compare_arrays(loss, want_loss, rtol=rtol, atol=atol)[1] is None, form
        for key in want:
            problem = compare_arrays(grads[key], want[key], rtol=rtol, atol=atol)[1]
            assert problem is None, (form, key, problem)


def assert_exact_on_a_drawn_case(name, data):
    """Draw small integers for recipe ``name`` (hypothesis ``data``): sums over
    at most 8 devices (|sum| <= 64 < 2**8) stay exact in every drawn dtype,
    bfloat16 included, so every form must equal the oracle bit for bit."""
    import collectives as cx
    from collectives.testing import assert_forms_agree
    from collectives.testing.strategies import recipe_cases

    recipe = cx.RECIPES[name]
    case = data.draw(recipe_cases(recipe))
    assert_forms_agree(recipe, *case.args, mesh=case.mesh, axis=case.axis,
                       rtol=0, atol=0)


def assert_draws_svg(diagram, record, tmp_path, widths=("wide",)):
    """A strategy diagram module's ``draw`` writes a real SVG of ``record``
    for each column width, legible there, and the module has its caption
    (skipped without matplotlib)."""
    import pytest

    from collectives import _figure

    pytest.importorskip("matplotlib")
    for width in widths:
        path = tmp_path / f"diagram-{width}.svg"
        diagram.draw(record, path, width=width)
        svg = path.read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and len(svg) > 10_000
        # legible in its column: text on screen >= 9 px, no legend over data
        assert _figure.problems(_figure.read_record(path), width) == [], width
    assert diagram.CAPTION and diagram.text(record)


def rank_env(*, strip=("SLURM_", "OMPI_", "PMI_", "PMIX_")):
    """This process's environment for a rank started by hand or by a real
    launcher: no cluster variables (none whose name starts with ``strip``
    either), this checkout importable, output unbuffered, CPU devices only
    (the rank chooses how many), compiled as the suite compiles."""
    from collectives.distributed import _cluster

    env = {name: value for name, value in os.environ.items()
           if name not in _cluster.CLUSTER_VARIABLES
           and not (strip and name.startswith(tuple(strip)))}
    for name in ("JAX_NUM_CPU_DEVICES", "PYTEST_XDIST_WORKER", "XLA_FLAGS"):
        env.pop(name, None)
    # the suite's compile setting (conftest.py) and nothing else of XLA_FLAGS
    optimization = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                    if flag.startswith("--xla_backend_optimization_level")]
    if optimization:
        env["XLA_FLAGS"] = " ".join(optimization)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["JAX_PLATFORMS"] = "cpu"
    return env


SLOW = "CI: once, on the newest JAX; the Explicit mode's also on the oldest"
"""Where the tests marked ``slow`` run (each takes a minute or more; the
default run stays short)."""


def only_with_marker(request, marker, where):
    """Skip unless the run selects ``marker`` (``-m marker``): tests that CI
    runs in a step of their own (``where`` says which)."""
    import pytest

    if marker not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"runs with -m {marker} ({where})")


# -- laws of one collective, checked per device inside shard_map ---------------


def run_body(body, mesh, axes, x, out_spec=None):
    """``body(block, axis=axes.axis)`` under shard_map with rows split over
    ``axes``; the output laid out as the input unless ``out_spec`` says."""
    import functools

    import jax
    import numpy as np

    in_spec = jax.P(axes.entry)
    f = jax.jit(jax.shard_map(functools.partial(body, axis=axes.axis), mesh=mesh,
                              in_specs=in_spec,
                              out_specs=in_spec if out_spec is None else out_spec))
    return np.asarray(f(x))


def law_cases():
    """A hypothesis strategy: ``(mesh, axes, x)`` with exact float32 ``x``
    whose row blocks split again into ``axes.size`` chunks."""
    return blocked_cases(rows_split_n_ways=True, dtypes=("float32",))


def blocked_cases(rows_split_n_ways=False, dtypes=("float32", "int32", "bfloat16")):
    """A hypothesis strategy: ``(mesh, axes, x)`` with exact ``x`` of shape
    ``[n * rows, m]`` (float32, int32 or bfloat16), rows split over the drawn
    axes (``rows`` a multiple of ``n`` where ``rows_split_n_ways``)."""
    from hypothesis import strategies as st

    import collectives as cx
    from collectives.testing.strategies import collective_axes
    from collectives.testing.strategies import exact_values
    from collectives.testing.strategies import meshes

    @st.composite
    def cases(draw):
        mesh = draw(meshes())
        axes = cx.RECIPES["psum"].axes(mesh, draw(collective_axes(mesh)))
        n = axes.size
        rows = draw(st.integers(1, 2)) * (n if rows_split_n_ways else 1)
        dtype = draw(st.sampled_from(list(dtypes)))
        x = exact_values(draw, (n * rows, draw(st.integers(1, 3))), dtype)
        return mesh, axes, x

    return cases()


def per_device(body, mesh, axes, x):
    """Run ``body`` per device; every device's outputs stacked, so nothing is
    assumed replicated: ``[n * out_rows, ...]`` per output."""
    import functools

    import jax
    import numpy as np

    spec = jax.P(axes.entry)
    f = jax.shard_map(functools.partial(body, axis=axes.axis), mesh=mesh,
                      in_specs=spec, out_specs=spec, check_vma=False)
    return jax.tree_util.tree_map(np.asarray, jax.jit(f)(x))


# -- Pallas kernels in interpret mode -------------------------------------------


def run_kernel_detected(body, x, mesh, in_spec, out_spec, mode):
    """``body`` (which calls a Pallas kernel) under shard_map in interpret mode
    with ``dma_execution_mode=mode``, race detection on and unwritten memory
    as NaN, bounded in time; its result as a NumPy array. Fails on a race.
    ``x`` a tuple: the body's arguments (``in_spec`` a tuple of specs)."""
    import jax
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    from collectives import _compat
    from collectives import _kernels

    params = pltpu.InterpretParams(dma_execution_mode=mode, detect_races=True,
                                   uninitialized_memory="nan")
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec,
                              check_vma=False))

    def run():  # in call_bounded's worker: the interpret context is per thread
        with pltpu.force_tpu_interpret_mode(params):
            return f(*x) if isinstance(x, tuple) else f(x)

    name = getattr(body, "__name__", None) or getattr(
        getattr(body, "func", None), "__name__", "kernel")
    out = np.asarray(_kernels.call_bounded(run, f"{name} ({mode})", 120))
    assert not _compat.interpret_races_found(), (
        f"{name}: a race in dma_execution_mode={mode!r}")
    return out


def documented_deferred_bytes(recipe, layout):
    """``(summed per microbatch, deferred)``: the row ``recipe``, ``layout``
    (e.g. ``"`fsdp_mlp`, gathers"``, ``"8-way data"``) of the strategies
    page's table of deferred gradient sums."""
    text = (ROOT / "docs" / "strategies.md").read_text()
    section = text[text.index("## Gradient accumulation: the sum deferred"):]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[:2] == [recipe, layout]:
            return int(cells[2]), int(cells[3])
    raise AssertionError(
        f"docs/strategies.md has no deferred-sum row {recipe} | {layout}")


# -- the kernel recipes' own test modules -------------------------------------

KERNEL_MODES = ("eager", "on_wait")
"""Interpret mode's DMA execution modes: a kernel is run in each."""


def kernel_module_marks():
    """A kernel test module's ``pytestmark``: skipped, saying why, on a JAX
    without interpret-mode kernels."""
    import jax
    import pytest

    from collectives import _compat

    return pytest.mark.skipif(
        not _compat.HAS_INTERPRET_KERNELS,
        reason=f"the kernels need JAX 0.10.2 or newer (this is {jax.__version__})")


def over_kernel_meshes(test):
    """``test(shape, names, axis)`` on a 1-D mesh of 8 and over each axis of
    a 4 x 2 mesh (the meshes a kernel runs on: one axis at a time)."""
    import pytest

    return pytest.mark.parametrize(
        "shape, names, axis",
        [((8,), ("i",), "i"), ((4, 2), ("i", "j"), "i"), ((4, 2), ("i", "j"), "j")],
        ids=["8-i", "4x2-i", "4x2-j"])(test)
