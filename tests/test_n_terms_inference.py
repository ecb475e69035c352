"""assert_forms_agree infers n_terms from the forms' jaxprs for plain callables.

Collective matmuls (all-gather, overlapped with ppermute one way or both
ways, reduce-scatter plain and as a ring) pass against a float64 reference
without an n_terms, which n_terms=1 does not allow; planted bugs still fail,
and the failure says which count was inferred and how to override it. The
rule itself (sums, products, collectives, loops, which forms count) is
checked through ``Agreement.n_terms`` and ``Agreement.n_terms_source``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from collectives.testing import assert_forms_agree
from collectives.testing import tolerance

N = 8  # devices on the mesh axis "i"
M, K, COLS = 64, 256, 32  # x: f32[M, K] @ w: f32[K, COLS]


@pytest.fixture(scope="module")
def mesh():
    return cx.make_mesh((N,), ("i",))


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((M, K)).astype(np.float32),
            rng.standard_normal((K, COLS)).astype(np.float32))


def reference(x, w):
    return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


# -- collective matmuls, written as a user would --------------------------------

def allgather_matmul(x_block, w_block):
    # x_block: f32[M / N, K], w_block: f32[K, COLS / N] -> f32[M, COLS / N]
    return lax.all_gather(x_block, "i", tiled=True) @ w_block


def allgather_matmul_ring(x_block, w_block, *, send=-1, skew=0):
    """Multiply the row block held now, then pass it on: device d holds rows
    of device d - send * step at each step (``send`` and ``skew`` plant bugs)."""
    rows, me = x_block.shape[0], lax.axis_index("i")
    perm = [(d, (d + send) % N) for d in range(N)]
    out = jnp.zeros((rows * N, w_block.shape[1]), x_block.dtype)
    for step in range(N):
        owner = (me + step + skew) % N  # correct for send=-1, skew=0
        out = lax.dynamic_update_slice_in_dim(out, x_block @ w_block, owner * rows, 0)
        x_block = lax.ppermute(x_block, "i", perm)
    return out


def allgather_matmul_bidirectional(x_block, w_block):
    """Half of each row block travels each way round the ring."""
    half, me = x_block.shape[0] // 2, lax.axis_index("i")
    left = [(d, (d - 1) % N) for d in range(N)]
    right = [(d, (d + 1) % N) for d in range(N)]
    top, bottom = x_block[:half], x_block[half:]
    out = jnp.zeros((2 * half * N, w_block.shape[1]), x_block.dtype)
    for step in range(N):
        up, down = (me + step) % N, (me - step) % N  # whose halves are here
        out = lax.dynamic_update_slice_in_dim(out, top @ w_block, up * 2 * half, 0)
        out = lax.dynamic_update_slice_in_dim(out, bottom @ w_block,
                                              down * 2 * half + half, 0)
        top, bottom = lax.ppermute(top, "i", left), lax.ppermute(bottom, "i", right)
    return out


def matmul_reduce_scatter(x_block, w_block):
    # x_block: f32[M, K / N], w_block: f32[K / N, COLS] -> f32[M / N, COLS]
    return lax.psum_scatter(x_block @ w_block, "i", scatter_dimension=0, tiled=True)


def matmul_reduce_scatter_ring(x_block, w_block, *, send=1):
    """An accumulator per row chunk travels the ring, each device adding its
    partial product; chunk d's ends on device d after N steps."""
    rows, me = x_block.shape[0] // N, lax.axis_index("i")
    perm = [(d, (d + send) % N) for d in range(N)]

    def partial(step):
        chunk = (me - 1 - step) % N
        return lax.dynamic_slice_in_dim(x_block, chunk * rows, rows, 0) @ w_block

    acc = partial(0)
    for step in range(1, N):
        acc = lax.ppermute(acc, "i", perm) + partial(step)
    return acc


GATHER = (P("i", None), P(None, "i")), P(None, "i")
SCATTER = (P(None, "i"), P("i", None)), P("i", None)
MATMULS = {  # name: (per-device body, in_specs, out_specs)
    "allgather": (allgather_matmul, *GATHER),
    "ring": (allgather_matmul_ring, *GATHER),
    "bidirectional": (allgather_matmul_bidirectional, *GATHER),
    "reduce_scatter": (matmul_reduce_scatter, *SCATTER),
    "reduce_scatter_ring": (matmul_reduce_scatter_ring, *SCATTER),
}


def shard_map_form(name, mesh, **bug):
    body, in_specs, out_specs = MATMULS[name]
    return jax.jit(jax.shard_map(functools.partial(body, **bug), mesh=mesh,
                                 in_specs=in_specs, out_specs=out_specs))


def matmul_forms(name, mesh, **bug):
    return {"shard_map": shard_map_form(name, mesh, **bug),
            "jit": jax.jit(jnp.matmul), "reference": reference}


@pytest.mark.parametrize("name", MATMULS)
def test_collective_matmuls_pass_with_the_inferred_count(mesh, operands, name):
    forms = matmul_forms(name, mesh)
    report = assert_forms_agree(forms, *operands)
    # the longest chain among the forms (NumPy cannot be traced): jit's x @ w
    assert report.n_terms == K
    assert report.n_terms_source == ("inferred from the jit form's jaxpr (longest "
                                     f"chain of roundings: dot_general over {K})")
    assert report.rtol == tolerance("float32", K)[0]
    # n_terms=1 would have cried wolf on these right answers
    with pytest.raises(AssertionError, match=r"n_terms=1\); atol scaled"):
        assert_forms_agree(forms, *operands, n_terms=1)


@pytest.mark.parametrize(("name", "count"), [
    ("allgather", f"dot_general over {K}"),
    ("ring", f"dot_general over {K}"),
    ("reduce_scatter", f"dot_general over {K // N} + psum_scatter over {N} on axis i"),
    # the accumulator's chain: its first partial product, then one add a step
    ("reduce_scatter_ring", f"dot_general over {K // N} + add ({N - 1} times)"),
])
def test_the_shard_map_form_alone_is_counted_without_a_jit_form(mesh, operands, name,
                                                                count):
    report = assert_forms_agree({"shard_map": shard_map_form(name, mesh),
                                 "reference": reference}, *operands)
    assert report.n_terms_source.endswith(f"roundings: {count})")


def test_a_one_device_jit_matmul_passes(operands):
    x, w = (jax.device_put(a, jax.devices()[0]) for a in operands)
    report = assert_forms_agree({"jit": jax.jit(jnp.matmul), "reference": reference},
                                x, w)
    assert report.n_terms == K and report.max_error["jit"] > 0


def test_a_jnp_reference_under_x64_is_the_one_counted(mesh, operands):
    def reference64(x, w):
        return jnp.asarray(x, jnp.float64) @ jnp.asarray(w, jnp.float64)

    with jax.enable_x64(True):
        report = assert_forms_agree(
            {"shard_map": shard_map_form("ring", mesh),
             "reference": reference64}, *operands)
    assert report.n_terms == K
    assert report.n_terms_source.startswith("inferred from the reference's jaxpr")


# -- planted bugs still fail -------------------------------------------------------

@pytest.mark.parametrize(("name", "bug"), [
    ("ring", {"send": 1}),  # blocks travel the wrong way round
    ("ring", {"skew": 1}),  # each block lands one slot off
    ("reduce_scatter_ring", {"send": -1}),
])
def test_planted_bugs_fail_and_say_which_count_was_inferred(mesh, operands, name,
                                                            bug):
    forms = matmul_forms(name, mesh, **bug)
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, *operands)
    message = str(info.value)
    assert message.startswith("forms: shard_map disagrees with the reference; jit "
                              "agrees.")
    assert (f"policy tolerance(float32, n_terms={K}); n_terms={K} inferred from the "
            "jit form's jaxpr (longest chain of roundings: dot_general over "
            f"{K}); pass n_terms= to override") in message


def test_a_contraction_missing_one_term_fails(operands):
    def short(x, w):  # an off-by-one contraction bound
        return x[:, :-1] @ w[:-1]

    with pytest.raises(AssertionError, match="jit disagrees with the reference"):
        assert_forms_agree({"jit": jax.jit(short), "reference": reference}, *operands)


def test_a_relative_error_of_1e_4_fails_under_the_inferred_count(operands):
    # not absurdly loose: 257 roundings allow 6.1e-5 relative (plus an atol
    # scaled by the inputs); this error passes from n_terms=394 on
    forms = {"jit": jax.jit(lambda x, w: (x @ w) * np.float32(1 + 1e-4)),
             "reference": reference}
    with pytest.raises(AssertionError, match=f"n_terms={K + 1} inferred"):
        assert_forms_agree(forms, *operands)


# -- what wins, and what stays as it was ---------------------------------------------

def test_an_explicit_n_terms_wins(mesh, operands):
    forms = matmul_forms("allgather", mesh)
    report = assert_forms_agree(forms, *operands, n_terms=4 * K)
    assert report.n_terms == 4 * K and report.n_terms_source == "given"
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, *operands, n_terms=1)
    assert "inferred" not in str(info.value)


def test_recipes_keep_their_own_count(mesh):
    recipe = cx.RECIPES["allgather_matmul"]
    args = recipe.example_args(mesh, seed=1)
    report = assert_forms_agree(recipe, *args, mesh=mesh)
    assert report.n_terms == recipe.n_terms(recipe.axes(mesh))
    assert report.n_terms_source == "recipe"


def test_an_inferred_count_under_which_nothing_fails_is_refused(operands):
    # 256 bfloat16 roundings allow 400 % error: even zeros would pass
    x, w = (a.astype(jnp.bfloat16) for a in operands)
    forms = {"jit": jax.jit(jnp.matmul), "reference": reference}
    with pytest.raises(ValueError, match=r"n_terms: 256 inferred from the jit form's "
                                         r"jaxpr .* relative error of 4 in bfloat16, "
                                         r"so the comparison could not fail\. Fix: "
                                         r"pass n_terms="):
        assert_forms_agree(forms, x, w)
    # XLA on CPU accumulates in float32 and rounds once
    assert assert_forms_agree(forms, x, w, n_terms=1).n_terms == 1


def test_integer_results_and_given_tolerances_infer_nothing():
    x = np.arange(8, dtype=np.int32)
    report = assert_forms_agree({"jit": jax.jit(jnp.cumsum), "reference": np.cumsum}, x)
    assert report.n_terms_source == "default"
    y = np.arange(8.0, dtype=np.float32)
    report = assert_forms_agree({"jit": jax.jit(jnp.cumsum), "reference": np.cumsum},
                                y, rtol=0, atol=0)
    assert report.n_terms_source == "default"


# -- the counting rule ------------------------------------------------------------

X = np.linspace(-1, 1, 64 * 16, dtype=np.float32).reshape(64, 16)
W = np.linspace(-1, 1, 16 * 8, dtype=np.float32).reshape(16, 8)


def psum_of_local_sums(mesh):
    return jax.jit(jax.shard_map(lambda b: lax.psum(b.sum(0), "i"), mesh=mesh,
                                 in_specs=P("i"), out_specs=P()))


def scan_sum(x):
    return lax.scan(lambda acc, row: (acc + row, None), jnp.zeros(16), x)[0]


def branch(x):
    return lax.cond(x[0, 0] > 0, lambda: x[0] * 2, lambda: x.sum(0))


@pytest.mark.parametrize(("fn", "args", "count", "chain"), [
    (lambda x: x.sum(0), (X,), 64, "reduce_sum over 64"),
    (lambda x: (x * x).sum(0), (X,), 65, "mul + reduce_sum over 64"),
    (lambda x, w: x @ w + 1, (X, W), 17, "dot_general over 16 + add"),
    # a product's roundings are its factors' plus its own
    (lambda x, w: (x @ w) @ (w.T @ w), (X, W), 16 + 16 + 8,
     "dot_general over 16 (2 times) + dot_general over 8"),
    # a sum of sums: the deeper branch, plus one
    (lambda x, w: x @ w + x[:, :8] * 2, (X, W), 17, "dot_general over 16 + add"),
    (jnp.cumsum, (X.ravel(),), 1024, "cumsum over 1024"),
    (scan_sum, (X,), 64, "add (64 times)"),
    (branch, (X,), 64, "reduce_sum over 64"),  # the longer branch
    (lambda x: jnp.roll(x, 1, 0).T, (X,), 0, "no rounding: data movement only"),
    (lambda x: x * 2, (X.astype(np.float64),), 2,
     "float64 input rounded to float32 + mul"),
])
def test_the_longest_chain_is_counted(fn, args, count, chain):
    report = assert_forms_agree({"jit": jax.jit(fn), "reference": fn}, *args)
    assert report.n_terms == count
    assert report.n_terms_source == (
        f"inferred from the reference's jaxpr (longest chain of roundings: {chain})")


def test_collectives_count_their_axis_size(mesh):
    x = np.ones((64, 4), np.float32)
    report = assert_forms_agree({"shard_map": psum_of_local_sums(mesh),
                                 "reference": lambda x: np.asarray(x).sum(0)}, x)
    # 8 local rows, then 8 devices
    assert report.n_terms == 16 and report.n_terms_source.endswith(
        "reduce_sum over 8 + psum over 8 on axis i)")
    moved = jax.jit(jax.shard_map(
        lambda b: lax.all_to_all(lax.ppermute(b, "i", [(d, (d + 1) % N)
                                                       for d in range(N)]),
                                 "i", 0, 0, tiled=True),
        mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    report = assert_forms_agree({"shard_map": moved, "reference": moved},
                                np.ones((64, 4), np.float32))
    assert report.n_terms == 0 and report.rtol == 0  # data movement: exact


def fori_ring_all_reduce(shift):
    """An all-reduce as a ring in a ``fori_loop``: each of the N - 1 steps
    passes a block on by ``shift`` and adds it (``shift=1`` is right)."""
    perm = [(d, (d + shift) % N) for d in range(N)]

    def body(block):
        # block: f32[rows, 16] on each device -> the sum of all N blocks
        def step(_, carry):
            total, passing = carry
            passing = lax.ppermute(passing, "i", perm)
            return total + passing, passing

        return lax.fori_loop(0, N - 1, step, (block, block))[0]

    return body


def ring_forms(mesh, shift):
    ring = jax.jit(jax.shard_map(fori_ring_all_reduce(shift), mesh=mesh,
                                 in_specs=P("i"), out_specs=P("i")))

    def reference(x):  # every device's block holds the sum of all N
        return np.tile(np.asarray(x, np.float64).reshape(N, -1, 16).sum(0), (N, 1))

    return {"shard_map": ring, "reference": reference}


def test_a_fori_loop_ring_all_reduce_is_counted_and_a_wrong_shift_fails(mesh):
    x = np.random.default_rng(1).standard_normal((N * 4, 16)).astype(np.float32)
    # the loop is a scan in the jaxpr: its 7 additions are the chain
    report = assert_forms_agree(ring_forms(mesh, 1), x)
    assert report.n_terms == N - 1 and report.n_terms_source == (
        "inferred from the shard_map form's jaxpr (longest chain of roundings: "
        "add (7 times))")
    with pytest.raises(AssertionError, match="shard_map disagrees with the reference"):
        assert_forms_agree(ring_forms(mesh, 2), x)  # every other block, twice


def test_a_jaxpr_this_jax_spells_anew_is_an_error_not_a_guess(mesh, monkeypatch):
    # stands for a JAX release that renames scan's parameters again
    def renamed(params, values):
        return params["num_consts_renamed"]

    monkeypatch.setattr(_compat, "scan_operands", renamed)
    x = np.ones((N * 4, 16), np.float32)
    with pytest.raises(RuntimeError) as info:
        assert_forms_agree(ring_forms(mesh, 1), x)
    message = str(info.value)
    assert f"JAX {jax.__version__}" in message
    assert "'scan' equation raised KeyError: 'num_consts_renamed'" in message
    assert "pass n_terms=" in message
    # with n_terms given, nothing is read
    assert assert_forms_agree(ring_forms(mesh, 1), x, n_terms=N - 1).n_terms == N - 1


def test_scan_operands_split_as_the_body_reads_them():
    def f(c, x, xs):
        def step(carry, row):
            a, b = carry
            return (a + row * c, b * c), row * 2

        return lax.scan(step, (x, x), xs)

    closed = jax.make_jaxpr(f)(jnp.float32(2), jnp.ones(3), jnp.ones((5, 3)))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    consts, carry, xs = _compat.scan_operands(eqn.params, eqn.invars)
    body = getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"])
    assert [v.aval.shape for v in carry] == [(3,), (3,)]
    assert [v.aval.shape for v in xs] == [(5, 3)]
    assert len(consts) + len(carry) + len(xs) == len(body.invars)
    assert _compat.scan_carry_count(eqn.params) == 2


def test_a_while_loop_that_accumulates_cannot_be_counted():
    def total(x, n):
        return lax.fori_loop(0, n, lambda i, acc: acc + x[i], jnp.zeros(16))

    forms = {"jit": jax.jit(total),
             "reference": lambda x, n: np.asarray(x, np.float64)[:n].sum(0) + 1}
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, X, np.int32(64))
    message = str(info.value)
    assert ("policy tolerance(float32, n_terms=1); n_terms=1 not inferred, no form's "
            "jaxpr could be counted (reference: jax.make_jaxpr cannot trace it "
            "(TracerArrayConversionError); jit: a while_loop adds roundings at every "
            "step and its trip count is not known when tracing); pass n_terms=, the "
            "rounded operations behind one output element") in message


def test_a_form_returning_values_computed_before_is_not_counted():
    want = X.sum(0)
    report = assert_forms_agree({"jit": jax.jit(lambda x: x.sum(0)),
                                 "reference": lambda x: jnp.asarray(want)}, X)
    assert report.n_terms == 64
    assert report.n_terms_source.startswith("inferred from the jit form's jaxpr")


def test_every_traceable_form_is_counted_not_only_the_reference():
    # The reference only picks a row: no rounding. The jit form averages 7
    # equal rows, which rounds in 35 of 64 elements: its chain must count.
    v = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    x = np.tile(v, (7, 1))
    forms = {"jit": jax.jit(lambda x: x.mean(0)), "reference": lambda x: x[0]}
    assert np.any(np.asarray(forms["jit"](x)) != v)
    report = assert_forms_agree(forms, x)
    assert report.n_terms == 8 and report.n_terms_source == (
        "inferred from the jit form's jaxpr (longest chain of roundings: "
        "reduce_sum over 7 + div)")
    with pytest.raises(AssertionError, match="jit disagrees with the reference"):
        assert_forms_agree(forms, x, n_terms=0)


def test_a_form_that_cannot_be_counted_is_named_beside_the_count():
    def total(x, n):
        return lax.fori_loop(0, n, lambda i, acc: acc + x[i], jnp.zeros(16))

    forms = {"shard_map": jax.jit(total),  # stands for a loop that is not counted
             "jit": jax.jit(lambda x, n: x.sum(0) * 2),  # the bug: doubled
             "reference": lambda x, n: np.asarray(x, np.float64).sum(0)}
    with pytest.raises(AssertionError) as info:
        assert_forms_agree(forms, X, np.int32(64))
    assert ("n_terms=65 inferred from the jit form's jaxpr (longest chain of "
            "roundings: reduce_sum over 64 + mul; shard_map not counted: a "
            "while_loop adds roundings at every step and its trip count is not "
            "known when tracing); pass n_terms= to override") in str(info.value)
