"""Sequence parallelism by all-to-all: the ``all_to_all_attention`` recipe.

One ``all_to_all`` per tensor reshards ``q``, ``k``, ``v`` from
sequence-sharded to head-sharded, attention runs locally on whole sequences
for ``heads / n`` heads, and a fourth ``all_to_all`` brings the output back
to sequence sharding (:mod:`collectives._facts.ring_attention` has the ring
alternative and the checks, layouts and plan facts both share).

The body, global program and NumPy oracle are
``recipes/all_to_all_attention.py``'s; this module adds the facts the
library needs about them, and the public body function validates its
arguments before calling the file's body.
"""

from __future__ import annotations

from collectives._costs import block_bytes
from collectives._costs import per_device_bytes
from collectives._facts.ring_attention import FLOAT
from collectives._facts.ring_attention import attention_n_terms
from collectives._facts.ring_attention import attention_plan
from collectives._facts.ring_attention import attention_shapes
from collectives._facts.ring_attention import attention_specs
from collectives._facts.ring_attention import check_attention_args
from collectives._facts.ring_attention import check_qkv
from collectives._facts.ring_attention import dense_attention_fact
from collectives._facts.ring_attention import heads_error
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import on_axes
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import all_to_all_attention as a2a_file


def all_to_all_attention(q, k, v, axis, *, causal: bool = False):
    """Attention by resharding sequence -> heads and back; call inside a body.

    One ``all_to_all`` each turns ``q``, ``k``, ``v`` from sequence blocks
    ``[s, H, d]`` into head groups ``[n * s, H / n, d]`` (whole sequences),
    attention runs locally, and one more ``all_to_all`` turns the output back
    into sequence blocks. Four all-to-alls, each moving ``(n-1)/n`` of a
    block; memory per device holds whole sequences for ``H / n`` heads.

    Args:
      q, k, v: this device's sequence block, ``[s, H, head_dim]`` each.
      axis: the mesh axis name (or tuple) the sequence is sharded over.
      causal: mask keys after the query's position.

    Returns:
      ``[s, H, head_dim]``: this device's rows of the attention output.

    Raises:
      ValueError: ``H`` is not a multiple of the axis size, the shapes differ,
        or ``axis`` is not bound.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> q, k, v = np.random.default_rng(0).normal(size=(3, 8, 4, 2))
      >>> body = functools.partial(cx.all_to_all_attention, axis="i")
      >>> f = jax.shard_map(body, mesh=mesh, in_specs=(jax.P("i"),) * 3,
      ...                   out_specs=jax.P("i"))
      >>> got = jax.jit(f)(q, k, v)
      >>> want = cx.RECIPES["all_to_all_attention"].reference(q, k, v, mesh=mesh)
      >>> bool(np.allclose(got, want, atol=1e-5))
      True
    """
    check_qkv(q, k, v, "all_to_all_attention")
    n = body_axis_size(axis, "all_to_all_attention")
    if q.shape[1] % n:
        raise heads_error(q.shape[1], n, axis, "all_to_all_attention")
    return a2a_file.all_to_all_attention_body(q, k, v, axis, causal)


def _all_to_all_fact(axes: Axes, args, form: str) -> Expectation:
    """shard_map: one all-to-all each for q, k, v and the output; jit: two
    all-gathers of K and V; explicit: the four all-to-alls, which its
    program writes as reshards between sequence and heads."""
    block = block_bytes(axes, args[0])
    if form == "jit":
        return dense_attention_fact(axes, block)
    moved = per_device_bytes("all-to-all", block, axes.size)
    return Expectation({"all-to-all": 4}, {"all-to-all": 4 * moved})



all_to_all_attention_recipe = register(Recipe(
    name="all_to_all_attention", family="strategy",
    recipe_file="all_to_all_attention.py",
    bitwise=False,  # softmax: exp rounds on any input
    cost_model=_all_to_all_fact,
    summary="sequence-sharded attention: all_to_all to heads, local attention, back",
    # q, k, v: [s, H, d] sequence blocks -> [S, H/n, d] head groups -> [s, H, d]
    body=a2a_file.all_to_all_attention_body,
    program=on_axes(a2a_file.attention_program),
    explicit_program=on_axes(a2a_file.all_to_all_attention_explicit_program),
    oracle=on_axes(a2a_file.attention_numpy),
    in_specs=attention_specs, out_specs=lambda axes: attention_specs(axes)[0],
    example_shapes=attention_shapes(heads_per_device=True), arg_names=("q", "k", "v"),
    n_terms=attention_n_terms, dtype_kinds=FLOAT,
    validate=check_attention_args(True, "all_to_all_attention"),
    plan=attention_plan("SP all-to-all", ring=False)))
