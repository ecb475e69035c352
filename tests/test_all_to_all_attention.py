"""``recipes/all_to_all_attention.py``: what only the all-to-all recipe
needs (heads that split over the axis). Its values, gradients and compiled
collectives are compared side by side with ring attention's in
tests/test_ring_attention.py."""

import functools

import jax
import numpy as np
import pytest

import collectives as cx


def _qkv(shape, seed=0, scale=1.0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple((scale * rng.standard_normal(shape)).astype(dtype) for _ in range(3))


def test_heads_that_do_not_split_over_the_axis_are_refused():
    mesh = cx.make_mesh((4,), "i")
    q, k, v = _qkv((8, 6, 2))
    with pytest.raises(ValueError, match=r"6 heads.*4 devices.*multiple of 4"):
        cx.RECIPES["all_to_all_attention"].shard_map(q, k, v, mesh=mesh)
    body = jax.shard_map(functools.partial(cx.all_to_all_attention, axis="i"),
                         mesh=mesh, in_specs=(jax.P("i"),) * 3, out_specs=jax.P("i"))
    with pytest.raises(ValueError, match=r"6 heads.*ring_attention"):
        body(q, k, v)
