"""Megatron's ``f`` and ``g``: the tensor-parallel sums with their backward fixed.

A Megatron pair (a column-split matmul then a row-split one over a model
axis) needs one ``psum`` over the model axis forward (``g``, after the
row-split matmul) and one backward (``f``, where a value replicated over the
model axis meets the column-split weights). Written as ``custom_vjp``
functions, the backward sums do not depend on how the body is typed: the
same code is right under shard_map with ``check_vma=False`` and under pmap,
where the model axis is ``vmap``ped and ``psum`` transposes to ``psum``.
"""

from __future__ import annotations

import functools

import jax
from jax import lax


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def model_identity_psum_grad(a, model_axis):
    """Megatron's ``f``: identity forward, ``psum`` over the model axis backward.

    Put it where a value replicated over the model axis meets model-split
    weights: each model device's cotangent is a partial sum.
    """
    return a


def _f_fwd(a, model_axis):
    return a, None


def _f_bwd(model_axis, _, g):
    return (lax.psum(g, model_axis),)


model_identity_psum_grad.defvjp(_f_fwd, _f_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def model_psum_identity_grad(a, model_axis):
    """Megatron's ``g``: ``psum`` over the model axis forward, identity backward."""
    return lax.psum(a, model_axis)


def _g_fwd(a, model_axis):
    return lax.psum(a, model_axis), None


def _g_bwd(model_axis, _, g):
    return (g,)


model_psum_identity_grad.defvjp(_g_fwd, _g_bwd)
