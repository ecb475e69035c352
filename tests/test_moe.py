"""Expert parallelism: the MoE layer equals its NumPy oracle in every form,
drops exactly the oracle's tokens for drawn capacities, equals dense routing
when nothing drops, and its expert-weight gradients equal single-device ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import collectives as cx
from collectives._facts.moe import moe_program
from collectives._facts.moe import moe_recipe
from collectives.hlo import collective_stats
from collectives.testing import assert_forms_agree

MESHES = [((8,), ("i",), None), ((4, 2), ("i", "j"), "i"), ((4, 2), ("i", "j"), "j")]


def _args(n, t, d=3, f=4, e=1, seed=0):
    rng = np.random.default_rng(seed)
    experts = n * e
    return (rng.standard_normal((d, experts)).astype(np.float32),
            rng.standard_normal((experts, d, f)).astype(np.float32),
            rng.standard_normal((experts, f, d)).astype(np.float32),
            rng.standard_normal((n * t, d)).astype(np.float32))


@settings(max_examples=5)
@given(config=st.sampled_from(MESHES), top_k=st.sampled_from([1, 2]),
       capacity=st.integers(1, 5), t=st.integers(1, 5), e=st.integers(1, 2),
       seed=st.integers(0, 2**16))
def test_dropped_counts_and_outputs_equal_the_oracle(config, top_k, capacity, t, e,
                                                     seed):
    shape, names, axis = config
    mesh = cx.make_mesh(shape, names)
    recipe = moe_recipe(top_k=top_k, capacity=capacity)
    n = recipe.axes(mesh, axis).size
    args = _args(n, t, e=e, seed=seed)
    report = assert_forms_agree(recipe, *args, mesh=mesh, axis=axis, n_terms=64)
    _, dropped = recipe.reference(*args, mesh=mesh, axis=axis)
    _, got = recipe.shard_map(*args, mesh=mesh, axis=axis)
    assert int(got) == int(dropped)
    assert report.forms


@pytest.mark.parametrize("top_k", [1, 2])
def test_every_form_equals_the_oracle_on_a_one_device_mesh(top_k):
    # a group dimension of size 1: JAX 0.12.1's repeat drops its sharding
    # unless the explicit form names it (the einsum then refused the types)
    mesh = cx.make_mesh((1,), "i")
    recipe = moe_recipe(top_k=top_k)
    report = assert_forms_agree(recipe, *_args(1, 3, e=2), mesh=mesh, n_terms=64)
    assert "explicit" in report.forms


def test_small_capacity_drops_later_tokens_first():
    # every token prefers expert 0: on each device, only the first `capacity`
    # tokens keep it; the rest are dropped and output zeros
    mesh = cx.make_mesh((4,), "i")
    _, w_in, w_out, x = _args(4, 5)
    x = np.abs(x) + 0.1  # positive tokens, so logit 0 is the largest
    router = np.zeros((3, 4), np.float32)
    router[:, 0] = 10.0
    recipe = moe_recipe(capacity=2)
    out, dropped = recipe.shard_map(router, w_in, w_out, x, mesh=mesh)
    assert int(dropped) == 4 * 3
    out = np.asarray(out).reshape(4, 5, -1)
    assert (out[:, 2:] == 0).all()
    logits = (x @ router).reshape(4, 5, -1)[:, :2]
    gate = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))[..., :1]
    kept = gate * (np.maximum(x.reshape(4, 5, -1)[:, :2] @ w_in[0], 0) @ w_out[0])
    np.testing.assert_allclose(out[:, :2], kept, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2])
def test_a_zero_logit_and_a_negative_zero_tie_to_the_lower_expert(top_k):
    # A zero token times a negative router weight is -0.0; lax.top_k orders
    # it below 0.0, while the two are equal and ties go to the lower index.
    mesh = cx.make_mesh((2, 4), ("i", "j"))
    router = np.zeros((1, 8), np.float32)
    router[0, 0] = -1.0
    x = np.zeros((16, 1), np.float32)
    x[15] = 1.0
    args = (router, np.zeros((8, 1, 2), np.float32), np.zeros((8, 2, 1), np.float32), x)
    recipe = moe_recipe(top_k=top_k, capacity=1)
    _, want = recipe.reference(*args, mesh=mesh, axis=("i", "j"))
    # each device's second zero token loses its experts (0, then 1) to the
    # first; on the last device token 15 routes to 1 (and 2) instead
    assert int(want) == {1: 7, 2: 15}[top_k]
    for form in cx.FORMS:
        _, got = recipe.forms(mesh, ("i", "j"))[form](*args)
        assert int(got) == int(want), form


@pytest.mark.parametrize("top_k", [1, 2])
def test_large_capacity_drops_nothing_and_equals_dense_routing(top_k):
    mesh = cx.make_mesh((8,), "i")
    router, w_in, w_out, x = _args(8, 4, e=2, seed=5)
    out, dropped = moe_recipe(top_k=top_k, capacity=4).shard_map(
        router, w_in, w_out, x, mesh=mesh)
    assert int(dropped) == 0
    logits = x.astype(np.float64) @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.zeros_like(x, dtype=np.float64)
    for row, choices in enumerate(np.argsort(-logits, axis=-1)[:, :top_k]):
        for j in choices:
            hidden = np.maximum(x[row] @ w_in[j].astype(np.float64), 0)
            want[row] += probs[row, j] * (hidden @ w_out[j])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("capacity", [1, 3])
def test_expert_weight_gradients_equal_the_single_device_program(capacity):
    mesh = cx.make_mesh((4,), "i")
    router, w_in, w_out, x = _args(4, 3, e=2, seed=7)
    recipe = moe_recipe(top_k=2, capacity=capacity)
    axes = recipe.axes(mesh)
    weights = np.random.default_rng(8).standard_normal(x.shape).astype(np.float32)
    layer = jax.shard_map(
        functools.partial(recipe.body, axis="i"), mesh=mesh,
        in_specs=recipe.in_specs(axes), out_specs=recipe.out_specs(axes))
    # the same program on one device: the global program without a mesh to shard
    one = cx.make_mesh((1,), "i")
    single = functools.partial(moe_program, axes=recipe.axes(one), top_k=2,
                               capacity=capacity, capacity_factor=1.0)

    def loss(fn, router, w_in, w_out):
        out, _ = fn(router, w_in, w_out, x)
        return jnp.sum(out * weights)

    got = jax.jit(jax.value_and_grad(functools.partial(loss, layer), (0, 1, 2)))(
        router, w_in, w_out)
    parts = [jax.value_and_grad(functools.partial(loss, _group_fn(single, x, d)),
                                (0, 1, 2))(router, w_in, w_out) for d in range(4)]
    want_value = sum(p[0] for p in parts)
    want_grads = [sum(p[1][i] for p in parts) for i in range(3)]
    np.testing.assert_allclose(got[0], want_value, rtol=1e-5)
    for g, w in zip(got[1], want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert np.abs(got[1][1]).sum() > 0  # the expert weights do get a gradient


def _group_fn(single, x, device):
    # device `device`'s tokens alone, through the one-device program; other
    # devices' rows are left out (their loss terms come from their own call)
    rows = slice(device * (x.shape[0] // 4), (device + 1) * (x.shape[0] // 4))

    def fn(router, w_in, w_out, _x):
        out, dropped = single(router, w_in, w_out, x[rows])
        return jnp.zeros(x.shape, out.dtype).at[rows].set(out), dropped
    return fn


@pytest.mark.parametrize("form", ["shard_map", "jit"])
@pytest.mark.parametrize("shape, names, axis", MESHES)
def test_compiled_collectives_meet_the_declared_fact(form, shape, names, axis):
    recipe = cx.RECIPES["moe_layer"]
    mesh = cx.make_mesh(shape, names)
    axes = recipe.axes(mesh, axis)
    args = recipe.example_args(mesh, axis, dims=(2, 3))
    stats = collective_stats(recipe.compiled(form, axes),
                             *recipe.place(*args, axes=axes))
    (fact,) = recipe.expected_costs(form, axes, args)
    assert fact.mismatch(stats) is None
    assert stats.count("all-to-all") == 2 and stats.count("all-reduce") == 1


def test_bad_inputs_are_refused_with_the_fix():
    mesh = cx.make_mesh((4,), "i")
    router, w_in, w_out, x = _args(4, 2)
    with pytest.raises(ValueError, match=r"6 experts.*4 devices"):
        cx.RECIPES["moe_layer"].shard_map(
            np.zeros((3, 6), np.float32), np.zeros((4, 3, 4), np.float32),
            w_out, x, mesh=mesh)
    with pytest.raises(ValueError, match=r"top_k.*Fix"):
        moe_recipe(top_k=3)
    with pytest.raises(ValueError, match=r"capacity.*positive int"):
        moe_recipe(capacity=0).shard_map(router, w_in, w_out, x, mesh=mesh)


@pytest.mark.accelerator
def test_dropless_form_equals_dense_routing():
    if jax.default_backend() == "cpu":
        pytest.skip("lax.ragged_all_to_all has no XLA:CPU implementation; needs a "
                    "GPU or TPU")
    n = min(jax.device_count(), 8)
    mesh = cx.make_mesh((n,), "i")
    router, w_in, w_out, x = _args(n, 4, e=2, seed=9)
    layer = jax.jit(jax.shard_map(
        functools.partial(cx.moe_layer_dropless, axis="i", top_k=2), mesh=mesh,
        in_specs=(jax.P(), jax.P("i"), jax.P("i"), jax.P("i")), out_specs=jax.P("i")))
    want, dropped = moe_recipe(top_k=2, capacity=4).reference(
        router, w_in, w_out, x, mesh=mesh)
    assert int(dropped) == 0
    np.testing.assert_allclose(layer(router, w_in, w_out, x), want, rtol=1e-5,
                               atol=1e-5)
