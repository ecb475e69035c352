"""Data-parallel training with optax.adam: every form equals single-device
training and the NumPy oracle after N steps; the n x gradient trap, which
Adam hides and gradient clipping exposes; a clear skip without optax."""

import functools
import sys

import jax
import numpy as np
import optax
import pytest
from jax import lax

import collectives as cx
from collectives import _compat
from collectives._compat import pvary
from collectives._facts.dp_grads import mse
from collectives._facts.optax_training import LR
from collectives._facts.optax_training import N_STEPS
from collectives.hlo import collective_stats
from collectives.recipes import optax_training as file
from collectives.testing import assert_forms_agree
from collectives.testing import compare_arrays
from collectives.testing import tolerance
from helpers import documented_deferred_bytes
from helpers import run_python

RECIPE = cx.RECIPES["dp_adam"]


def one_device(params, x, y, optimizer, n_steps=N_STEPS):
    """Plain single-device training: the result every form must reproduce."""
    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    state, losses = optimizer.init(params), []
    for _ in range(n_steps):
        loss, params, state = step(params, state)
        losses.append(loss)
    return np.asarray(losses), params


@pytest.mark.parametrize("shape,axis", [((8,), None), ((4, 2), "j")])
def test_every_form_equals_one_device_adam(shape, axis):
    mesh = cx.make_mesh(shape, ("i", "j")[:len(shape)])
    args = RECIPE.example_args(mesh, axis, dims=(3, 3, 2), seed=5)
    n_terms = RECIPE.n_terms(RECIPE.axes(mesh, axis))
    report = assert_forms_agree(RECIPE, *args, mesh=mesh, axis=axis)
    want = one_device(*args, optax.adam(LR))
    rtol, atol = tolerance("float32", n_terms)
    for form in ("pmap", "shard_map", "jit"):
        got = report.results[form]
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want),
                        strict=True):
            assert compare_arrays(g, w, rtol=rtol, atol=atol)[1] is None, form
    losses, _ = report.results["shard_map"]
    assert losses[-1] < losses[0]  # Adam lowers the loss


def _train_shard_map(params, x, y, mesh, optimizer, trap, n_steps):
    body = functools.partial(file.adam_step_per_device, optimizer=optimizer,
                             axis="i", vary=not trap)
    step = jax.jit(jax.shard_map(
        body, mesh=mesh, in_specs=(jax.P(), jax.P(), jax.P("i"), jax.P("i")),
        out_specs=(jax.P(), jax.P(), jax.P())))
    state = optimizer.init(params)
    for _ in range(n_steps):
        _, params, state = step(params, state, x, y)
    return params


def test_the_n_times_gradient_trap_with_an_optimiser():
    mesh = cx.make_mesh((8,), "i")
    params, x, y = RECIPE.example_args(mesh, dims=(3, 3, 2), seed=1)

    # The gradients themselves: grad at invariant params, then pmean, is 8x.
    def grads(trap):
        def body(p, xb, yb):
            local = p if trap else jax.tree_util.tree_map(
                lambda a: pvary(a, "i"), p)
            return lax.pmean(jax.grad(mse)(local, xb, yb), "i")
        return jax.jit(jax.shard_map(body, mesh=mesh,
                                     in_specs=(jax.P(), jax.P("i"), jax.P("i")),
                                     out_specs=jax.P()))(params, x, y)
    right, wrong = grads(False), grads(True)
    np.testing.assert_allclose(wrong["w"], 8 * np.asarray(right["w"]), rtol=1e-5)

    # Adam hides it: m / (sqrt(v) + eps) does not see the factor (only eps
    # does, 1e-8 against gradients of order 1), so training "works".
    adam = optax.adam(LR)
    rtol, atol = tolerance("float32", RECIPE.n_terms(RECIPE.axes(mesh)))
    _, want = one_device(params, x, y, adam)
    for trap in (False, True):
        got = _train_shard_map(params, x, y, mesh, adam, trap=trap, n_steps=N_STEPS)
        for k in want:
            assert compare_arrays(got[k], want[k], rtol=rtol, atol=atol)[1] is None

    # Anything that reads the scale shows it, e.g. SGD: one step goes 8x as far.
    sgd = optax.sgd(LR)
    _, want = one_device(params, x, y, sgd, n_steps=1)
    trapped = _train_shard_map(params, x, y, mesh, sgd, trap=True, n_steps=1)
    for k in want:
        np.testing.assert_allclose(np.asarray(trapped[k]) - params[k],
                                   8 * (np.asarray(want[k]) - params[k]), rtol=1e-4)


def test_float16_params_are_refused_where_adam_would_give_nan():
    # optax.adam's eps rounds to 0 in float16: a zero gradient updates by 0/0.
    zero = np.zeros((1, 1), np.float16)
    _, nan = one_device({"w": zero, "b": zero[0]}, zero, zero, optax.adam(LR), 1)
    assert np.isnan(np.asarray(nan["w"])).all()
    mesh = cx.make_mesh((8,), ("i",))
    params, x, y = RECIPE.example_args(mesh, "i", dtype="float16")
    forms = RECIPE.forms(mesh, "i")  # every form that runs on this JAX
    assert set(forms) >= {"pmap", "shard_map", "jit", "reference"}
    for form in forms.values():
        with pytest.raises(cx.UnsupportedDtypeError,
                           match=r"params has dtype float16.*eps.*NaN.*Fix: keep "
                                 r"params .* in float32"):
            form(params, x, y)
    # check lists the refusal as a skipped row, with the reason.
    (row,) = cx.check(["dp_adam"], dtypes=("float16",), configs=[((8,), ("i",), None)])
    assert row.ok and row.skipped and "eps" in row.detail
    # bfloat16 holds eps (float32's exponent range): accepted.
    RECIPE.forms(mesh, "i")["jit"](*RECIPE.example_args(mesh, "i", dtype="bfloat16"))


def test_oracle_matches_optax_in_float64():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 3)), rng.standard_normal((16, 2))
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    with jax.enable_x64(True):
        losses, got = one_device(params, x, y, optax.adam(LR))
        want_losses, want = file.train_numpy(params, x, y, N_STEPS, LR)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-10)


def test_without_optax_import_works_and_check_skips(tmp_path):
    script = tmp_path / "no_optax.py"
    script.write_text(
        "import sys\n"
        "sys.modules['optax'] = None  # import optax now raises ImportError\n"
        "import collectives as cx\n"
        "cx.use_cpu_devices(8)\n"
        "rows = cx.check(['dp_adam'], configs=[((8,), ('i',), None)])\n"
        "(row,) = rows\n"
        "print(row.skipped, row.ok, row.detail)\n")
    result = run_python(str(script), env={"PYTHONPATH": ":".join(sys.path)})
    assert result.stdout.startswith("True True"), result.stdout
    assert "pip install optax (jax-collectives' 'train' extra" in result.stdout


# -- the explicit form: one deferred sum a step ------------------------------------

@pytest.mark.skipif(
    not _compat.UNREDUCED_GRADIENTS_CHECKED,
    reason=f"JAX {jax.__version__}: reduced/unreduced gradient types are not "
           "checked on this release (checked from "
           f"{'.'.join(map(str, _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE))})")
def test_deferred_sum_all_reduces_half_the_bytes_of_two_microbatches_a_step():
    # Each Adam step on two microbatches: summed over "i" as each gradient is
    # taken, the losses and gradients are all-reduced twice a step; deferred
    # (unreduced shares added on each device), once. The scan's body holds
    # one step's collectives.
    mesh = jax.make_mesh((8,), ("i",), axis_types=_compat.explicit_axis_types(1))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 5)).astype(np.float32)
    y = rng.standard_normal((32, 4)).astype(np.float32)
    params = {"w": np.zeros((5, 4), np.float32), "b": np.zeros(4, np.float32)}
    want = file.train_numpy(params, x, y, N_STEPS, LR)
    tol = file.tolerance(*x.shape, n_steps=N_STEPS)
    step_bytes = 4 * (1 + 5 * 4 + 4)  # the loss, dw [5, 4] and db [4], float32
    with jax.set_mesh(mesh):
        placed = (jax.sharding.reshard(params, jax.P()),
                  *jax.sharding.reshard((x, y), jax.P("i")))
        sent = {}
        for name, program in (("each", file.train_microbatches_program),
                              ("deferred", file.train_deferred_program)):
            fn = jax.jit(functools.partial(program, n_steps=N_STEPS, lr=LR, n_micro=2))
            losses, trained = fn(*placed)
            pairs = [(losses, want[0])] + [(trained[k], want[1][k]) for k in "wb"]
            for got, ref in pairs:
                np.testing.assert_allclose(np.asarray(got), ref, rtol=tol, atol=tol,
                                           err_msg=name)
            stats = collective_stats(fn, *placed)
            assert set(stats.nonzero()) == {"all-reduce"}, (name, stats.nonzero())
            sent[name] = sum(op.operand_bytes for op in stats.ops)
    assert sent == {"each": 2 * step_bytes, "deferred": step_bytes}, sent
    assert documented_deferred_bytes("`dp_adam`", "8-way data") == (
        sent["each"], sent["deferred"])


def test_the_library_explicit_form_is_the_deferred_program():
    assert RECIPE.explicit_program.__wrapped__ is file.train_deferred_program
    assert file.DEFERRED_SUM_SINCE == _compat.UNREDUCED_GRADIENTS_CHECKED_SINCE
    mesh = cx.make_mesh((8,), ("i",))
    args = RECIPE.example_args(mesh, dims=(3, 3, 2))
    if _compat.UNREDUCED_GRADIENTS_CHECKED:
        assert_forms_agree(RECIPE, *args, mesh=mesh)
    else:
        with pytest.raises(NotImplementedError, match=r"deferred gradient sum .*"
                           r"needs JAX >= 0\.9\.1"):
            RECIPE.explicit(*args, mesh=mesh)
