"""Sequence parallelism: attention with the sequence sharded over devices.

Long contexts do not fit one device, so ``q``, ``k`` and ``v`` (each
``[seq, heads, head_dim]``) are sharded along the sequence. Every query needs
every key, and two recipes bring them together:

* **ring attention** (:func:`ring_attention`): each device keeps its query
  block and passes its key/value block round the ring with ``ppermute``,
  ``n - 1`` steps inside a ``lax.scan``. Scores never exist for the whole
  sequence: an online (log-sum-exp) softmax keeps, per query, the running
  maximum ``m``, the running sum ``l`` of ``exp(score - m)`` and the
  unnormalised output ``o``, rescaling them by ``exp(m_old - m_new)`` when a
  larger score arrives. K/V per device stay ``1/n`` of the sequence. With
  ``causal=True`` a query attends to keys at or before its position; blocks
  wholly above the diagonal (from later devices) are masked out entirely.
* **all-to-all attention** (:func:`all_to_all_attention`): one ``all_to_all``
  per tensor reshards ``q``, ``k``, ``v`` from sequence-sharded to
  head-sharded, attention runs locally on whole sequences for ``heads / n``
  heads, and a fourth ``all_to_all`` brings the output back to sequence
  sharding. The heads must divide evenly over the devices.

The all-to-all recipe's facts are in :mod:`collectives._facts.all_to_all_attention`,
which shares this module's checks, layouts and plan facts.

Both compute in float32 at least (``float16``/``bfloat16`` inputs are
upcast for the scores and the softmax statistics) and return the input
dtype. The jit form of both recipes is plain dense attention on the global
arrays; XLA decides the communication.

Mesh axes other than the sequence axes shard the heads.

The body, global program and NumPy oracle are ``recipes/ring_attention.py``'s;
this module adds the facts the library needs about them, and the public body
function validates its arguments before calling the file's body.
"""

from __future__ import annotations

import numpy as np

from collectives._costs import block_bytes
from collectives._costs import per_device_bytes
from collectives._layout import Axes
from collectives._layout import body_axis_size
from collectives._layout import make_spec
from collectives._layout import on_axes
from collectives._layout import with_options
from collectives._presentation import PlanSpec
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import ring_attention as ring_file

FLOAT = frozenset({"float"})


def check_qkv(q, k, v, what: str) -> None:
    if q.ndim != 3 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"{what}: expected q, k, v of one shape [seq, heads, head_dim], got "
            f"q {q.shape}, k {k.shape}, v {v.shape}. Fix: pass three 3-D arrays of "
            "the same shape (split a fused qkv projection first).")


def ring_attention(q, k, v, axis, *, causal: bool = False):
    """Softmax attention over a sequence sharded along ``axis``; call inside a body.

    Each device keeps its query block; key/value blocks travel round the ring
    (``n - 1`` ``ppermute`` steps of one K and one V block, in a
    ``lax.scan``) and are folded in with an online log-sum-exp softmax, so no
    device ever holds more than one remote K/V block or the full score
    matrix. Differentiable (autodiff through the scan).

    Args:
      q, k, v: this device's sequence block, ``[s, heads, head_dim]`` each;
        device ``d`` holds positions ``d * s : (d + 1) * s``.
      axis: the mesh axis name (or tuple) the sequence is sharded over.
      causal: mask keys after the query's position (blocks from later
        devices are masked out entirely).

    Returns:
      ``[s, heads, head_dim]``: this device's rows of
      ``softmax(q k^T / sqrt(head_dim)) v``, in ``q``'s dtype.

    Raises:
      ValueError: the shapes differ or are not 3-D, or ``axis`` is not bound.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> q, k, v = np.random.default_rng(0).normal(size=(3, 16, 2, 4))
      >>> body = functools.partial(cx.ring_attention, axis="i", causal=True)
      >>> f = jax.shard_map(body, mesh=mesh, in_specs=(jax.P("i"),) * 3,
      ...                   out_specs=jax.P("i"))
      >>> got = jax.jit(f)(q, k, v)
      >>> want = cx.RECIPES["ring_attention_causal"].reference(q, k, v, mesh=mesh)
      >>> bool(np.allclose(got, want, atol=1e-5))
      True
    """
    check_qkv(q, k, v, "ring_attention")
    body_axis_size(axis, "ring_attention")
    return ring_file.ring_attention_body(q, k, v, axis, causal)


def heads_error(heads: int, n: int, axis, what: str) -> ValueError:
    return ValueError(
        f"{what}: q, k, v have {heads} heads (per device block), which must "
        f"split evenly over the {n} devices along axis {axis!r}. Fix: use a "
        f"head count that is a multiple of {n}, or ring_attention, which "
        "shards only the sequence.")


# -- recipes ---------------------------------------------------------------
# Global view: q, k, v [S, H, D], S sharded over the recipe's axes, H over the
# other mesh axes; output [S, H, D] sharded the same way.

def attention_specs(axes: Axes):
    spec = make_spec(axes.entry, axes.others_entry)
    return (spec, spec, spec)


def attention_shapes(heads_per_device: bool):
    def shapes(axes: Axes, dims):
        s, h, d = (tuple(dims) * 3)[:3]
        heads = axes.others_size * h * (axes.size if heads_per_device else 1)
        shape = (axes.size * s, heads, d)
        return (shape, shape, shape)
    return shapes


def attention_n_terms(axes: Axes) -> int:
    # exp, sums over the sequence (at most 3 keys per device in the examples)
    # and the rescaling at each ring step
    return 16 * axes.size


def dense_attention_fact(axes: Axes, block: int) -> Expectation:
    # dense attention on sequence-sharded inputs: XLA all-gathers K and V
    # (sequence parallelism by all-gather), each device then computes its rows
    gathered = per_device_bytes("all-gather", block, axes.size)
    return Expectation({"all-gather": 2}, {"all-gather": 2 * gathered})


def _ring_fact(axes: Axes, args, form: str) -> Expectation:
    """shard_map: ``n - 1`` ring steps of one K and one V block each (the
    scan is unrolled, so the HLO holds ``2 (n - 1)`` collective-permutes);
    jit: two all-gathers of K and V; explicit: the same two, which its
    program writes as reshards of K and V to whole sequences."""
    block = block_bytes(axes, args[0])
    if form in ("jit", "explicit"):
        return dense_attention_fact(axes, block)
    steps = 2 * (axes.size - 1)
    return Expectation({"collective-permute": steps},
                       {"collective-permute": steps * block})


def _plan_shapes(axes: Axes, model):
    """One attention of ``model``: ``seq`` tokens of ``batch * heads``
    independent heads (attention never mixes them, so the batch folds into
    the heads dimension), ``width / heads`` per head."""
    shape = (model.seq, model.batch * model.heads, model.width // model.heads)
    return (shape, shape, shape)


def attention_plan(label: str, *, ring: bool = True) -> PlanSpec:
    """A sequence-parallel attention's :class:`PlanSpec`: a ring's sends
    overlap the block it computes; an all-to-all's are waited for."""
    return PlanSpec(label=label, shapes=_plan_shapes, axis="last", params=(),
                    scope="layer", overlap="compute",
                    serial="none" if ring else "all",
                    unit="one attention (q, k, v to output), forward",
                    repeats=lambda axes, model: model.layers)


def check_attention_args(heads_split: bool, what: str):
    def validate(axes: Axes, args) -> None:
        q, k, v = (np.shape(x) for x in args)
        if len(q) != 3 or k != q or v != q:
            raise ValueError(
                f"{what}: expected q, k, v of one shape [seq, heads, head_dim], got "
                f"q {q}, k {k}, v {v}. Fix: pass three 3-D arrays of the same "
                "shape.")
        local_heads = q[1] // axes.others_size
        if heads_split and local_heads % axes.size:
            raise heads_error(local_heads, axes.size, axes.axis, what)
    return validate


def _ring_recipe(name: str, summary: str, causal: bool) -> Recipe:
    # q, k, v: [s, h, d] sequence blocks -> [s, h, d]
    body = with_options(ring_file.ring_attention_body, causal=causal)
    return register(Recipe(
        name=name, summary=summary, family="strategy", recipe_file="ring_attention.py",
        bitwise=False,  # softmax: exp rounds, and the ring sums in another order
        cost_model=_ring_fact,
        plan=attention_plan("SP ring causal" if causal else "SP ring"), body=body,
        # pmap maps mesh axes after the first with vmap: one axis per ppermute
        pmap_body=with_options(ring_file.ring_attention_body, causal=causal,
                         shift=ring_file.stepwise_shift),
        program=on_axes(ring_file.attention_program, causal=causal),
        explicit_program=on_axes(ring_file.ring_attention_explicit_program,
                                 causal=causal),
        oracle=on_axes(ring_file.attention_numpy, causal=causal),
        in_specs=attention_specs, out_specs=lambda axes: attention_specs(axes)[0],
        example_shapes=attention_shapes(heads_per_device=False),
        arg_names=("q", "k", "v"), n_terms=attention_n_terms, dtype_kinds=FLOAT,
        validate=check_attention_args(False, name)))


ring_attention_recipe = _ring_recipe(
    "ring_attention",
    "sequence-sharded attention: K/V blocks round the ring, online softmax",
    causal=False)
ring_attention_causal_recipe = _ring_recipe(
    "ring_attention_causal",
    "ring attention with a causal mask (blocks above the diagonal masked)",
    causal=True)
