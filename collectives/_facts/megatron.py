"""Megatron's ``f`` and ``g``: the tensor-parallel sums with their backward fixed.

A Megatron pair (a column-split matmul then a row-split one over a model
axis) needs one ``psum`` over the model axis forward (``g``, after the
row-split matmul) and one backward (``f``, where a value replicated over the
model axis meets the column-split weights). Written as ``custom_vjp``
functions, the backward sums do not depend on how the body is typed: the
same code is right under shard_map with ``check_vma=False`` and under pmap,
where the model axis is ``vmap``ped.

They are ``recipes/fsdp.py``'s (the FSDP x TP body uses them), kept
importable from here.
"""

from __future__ import annotations

from collectives.recipes.fsdp import model_identity_psum_grad
from collectives.recipes.fsdp import model_psum_identity_grad

__all__ = ["model_identity_psum_grad", "model_psum_identity_grad"]
