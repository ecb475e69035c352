"""FSDP (ZeRO-3): parameters sharded over the data axis, gathered layer by layer.

The MLP of :mod:`collectives._facts.dp_tp_mlp` (four dense layers, relu between them,
mean-squared-error loss), trained fully sharded: every parameter is split on
dim 0 over the data axis, so each device stores ``1/n`` of the parameters,
of their gradients and of the optimiser state. Per layer:

* forward: the layer's weight and bias blocks are flattened into one buffer
  and **all-gathered** (one op per layer), used, and dropped;
* backward: ``jax.checkpoint`` with a policy that saves only each layer's
  pre-activation, not the gathered weights, so the backward pass
  **all-gathers them again**
  (layer 1 excepted: no gradient flows into ``x``, so its weights are not
  needed backward);
* gradients: the transpose of the all-gather is a **reduce-scatter**
  (``psum_scatter``), so each device receives the summed gradient of its own
  block only, already laid out like the sharded parameters.

FSDP x TP (``fsdp_tp_mlp``) adds the Megatron layout of ``dp_tp_mlp`` over a
model axis, on both layer pairs: ``w1`` and ``w3`` (with ``b1``, ``b3``)
split by columns and ``w2``, ``w4`` by rows over the model axis, ``b2`` and
``b4`` whole, and each block also split over the data axis on its other
dimension (``w1: P(data, model)``, ``b1: P((model, data))``,
``w2: P(model, data)``, ``b2: P(data)``; layers 3 and 4 alike). The
model-axis sums are Megatron's ``f`` and ``g`` operators
(``model_identity_psum_grad`` before ``w1`` and ``w3``, whose backward sum
only ``w3``'s runs, as no gradient flows into ``x``;
``model_psum_identity_grad`` after ``w2`` and ``w4``), which fix the
backward sum by hand, so the same body runs under pmap, where the model
axis is ``vmap``\\ ped.

The explicit form accumulates two microbatches (where each device's rows
halve) with the reduce-scatter deferred: each weight gathered once to its
layout as used, typed ``reduced`` over the data axis, the ``unreduced``
gradient shares of the microbatches added on each device, and one
``reshard`` to the stored layout scattering the total (JAX >= 0.9.1,
``check`` skips it before). It holds whole weights and gradient shares
through the step, as data parallelism does.

The bodies, global programs and NumPy oracle are ``recipes/fsdp.py``'s (which
shares nothing with ``recipes/dp_tp_mlp.py``: each file stands alone); this
module adds the facts the library needs about them, and the public helpers
(:func:`fsdp_specs`, :func:`gather_layer`, :func:`fsdp_value_and_grad`) that
validate, then call the file.
"""

from __future__ import annotations

import math

from jax.sharding import PartitionSpec as P

from collectives._costs import compiled_for
from collectives._costs import per_device_bytes
from collectives._costs import unreduced_sum
from collectives._facts.dp_grads import deferred_sum_reason
from collectives._facts.dp_grads import microbatch_count
from collectives._facts.dp_tp_mlp import Params
from collectives._facts.dp_tp_mlp import body_of
from collectives._facts.dp_tp_mlp import data_and_model_axes
from collectives._facts.dp_tp_mlp import deferred_program_of
from collectives._facts.dp_tp_mlp import loss_and_grads_specs
from collectives._facts.dp_tp_mlp import magnitudes_of
from collectives._facts.dp_tp_mlp import mlp_n_terms
from collectives._facts.dp_tp_mlp import mlp_plan
from collectives._facts.dp_tp_mlp import needs_data_and_model_axes
from collectives._facts.dp_tp_mlp import program_of
from collectives._facts.dp_tp_mlp import term_norms
from collectives._layout import Axes
from collectives._layout import axis_tuple
from collectives._layout import body_axis_size
from collectives._layout import on_axes
from collectives._recipe import WIDE_FLOATS
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import fsdp as file

N_LAYERS = file.N_LAYERS


def fsdp_specs(data_axis, model_axis: str | None = None) -> dict[str, P]:
    """The ``PartitionSpec`` of every MLP parameter under FSDP (x TP).

    Args:
      data_axis: the mesh axis (or tuple) that shards every parameter.
      model_axis: the tensor-parallel axis of Megatron's layer pairs, or
        ``None``.

    Returns:
      A dict from parameter name to spec: dim 0 over the data axis; with a
      model axis ``w1, w3: P(data, model)``, ``b1, b3: P((model, data))``,
      ``w2, w4: P(model, data)``, ``b2, b4: P(data)``.

    Examples:
      >>> import jax
      >>> import collectives as cx
      >>> cx.fsdp_specs("data")["w3"] == jax.P("data")
      True
      >>> cx.fsdp_specs("data", "model")["w3"] == jax.P("data", "model")
      True
      >>> cx.fsdp_specs("data", "model")["w4"] == jax.P("model", "data")
      True
    """
    return file.fsdp_specs(data_axis, model_axis)


def gather_layer(w_block, b_block, axis, *, w_dim: int = 0, one_axis_at_a_time=False):
    """All-gather a layer's weight and bias blocks in one collective.

    Call inside a body. The blocks are flattened into one buffer, gathered
    (tiled) over ``axis`` and cut back into the whole weight and bias; the
    transpose (the backward pass) is one ``psum_scatter``.

    Args:
      w_block: this device's block of the weight, split on ``w_dim``.
      b_block: this device's block of the bias (split on dim 0).
      axis: the mesh axis (or tuple) the blocks are split over.
      w_dim: the weight dimension split over ``axis``.
      one_axis_at_a_time: gather a tuple of axes one by one, innermost first
        (under pmap, ``vmap`` gathers one axis at a time).

    Returns:
      ``(w, b)``: the weight and bias whole along the gathered dimensions.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "i")
      >>> w, b = np.arange(24.0).reshape(8, 3), np.arange(4.0)
      >>> f = jax.shard_map(lambda w, b: cx.gather_layer(w, b, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P(), check_vma=False)
      >>> gw, gb = f(w, b)
      >>> bool((gw == w).all()), bool((gb == b).all())
      (True, True)
    """
    return file.gather_layer(w_block, b_block, axis, w_dim, one_axis_at_a_time)


def fsdp_value_and_grad(params: Params, x, y, *, data_axis, model_axis=None,
                        one_axis_at_a_time: bool = False):
    """Loss and gradients of the MLP, fully sharded; call inside a body.

    Args:
      params: this device's blocks, as :func:`fsdp_specs` splits them.
      x: this device's rows of the batch, ``[b, d_in]``.
      y: the matching targets, ``[b, d_out]``.
      data_axis: the mesh axis (or tuple) that splits the batch and the
        parameters.
      model_axis: the tensor-parallel axis, or ``None``.
      one_axis_at_a_time: gather tuple axes one by one (for pmap).

    Returns:
      ``(loss, grads)``: the full-batch loss (the same on every device) and
      this device's block of every gradient, laid out like ``params``.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4,), "data")
      >>> params = cx.init_mlp((4, 8, 8, 8, 4))
      >>> x, y = np.ones((8, 4), np.float32), np.zeros((8, 4), np.float32)
      >>> specs = cx.fsdp_specs("data")
      >>> f = jax.jit(jax.shard_map(
      ...     functools.partial(cx.fsdp_value_and_grad, data_axis="data"),
      ...     mesh=mesh, in_specs=(specs, jax.P("data"), jax.P("data")),
      ...     out_specs=(jax.P(), specs)))
      >>> loss, grads = f(params, x, y)
      >>> want = jax.jit(jax.value_and_grad(cx.mlp_loss))(params, x, y)
      >>> bool(np.allclose(grads["w3"], want[1]["w3"], rtol=1e-5, atol=1e-6))
      True
      >>> grads["w3"].sharding.spec == specs["w3"]  # this device's rows only
      True
    """
    body_axis_size(data_axis, "fsdp_value_and_grad")
    if model_axis is not None:
        body_axis_size(model_axis, "fsdp_value_and_grad")
    return file.value_and_grad_per_device(params, x, y, data_axis, model_axis,
                                          one_axis_at_a_time)


def fsdp_term_norms(params: Params, x, y, *, power: int):
    """:func:`collectives._facts.dp_tp_mlp.term_norms` of ``recipes/fsdp.py``'s
    forward and backward pass (the oracle of ``fsdp_mlp`` and
    ``fsdp_tp_mlp``)."""
    return term_norms(file.forward_backward, params, x, y, power=power)


# -- recipes ---------------------------------------------------------------

_needs_two_axes = needs_data_and_model_axes(
    "parameters and batch split over the first, Megatron's W1, W3 by columns "
    "and W2, W4 by rows over the second")


def _specs(model: bool):
    return loss_and_grads_specs(fsdp_specs, model)


def _shapes(model: bool):
    def shapes(axes: Axes, dims):
        data, model_axis = data_and_model_axes(axes, model)
        n = math.prod(axes.mesh.shape[name] for name in axis_tuple(data))
        t = axes.mesh.shape[model_axis] if model else 1
        b = dims[0]
        hidden = n * t  # the least that divides by n (FSDP) and n * t (b2)
        sizes = (n, hidden, hidden, hidden, n)
        params = {}
        for layer in range(1, N_LAYERS + 1):
            fan_in, fan_out = sizes[layer - 1], sizes[layer]
            params[f"w{layer}"], params[f"b{layer}"] = (fan_in, fan_out), (fan_out,)
        return (params, (b * n, sizes[0]), (b * n, sizes[-1]))
    return shapes


def _block_bytes(params, n: int, t: int) -> dict[str, int]:
    """Bytes of each parameter's block on one device (FSDP over ``n``, and
    the parameters Megatron splits, all but ``b2`` and ``b4``, also over
    ``t``)."""
    used = file.used_specs(file.MODEL)
    return {name: value.size * value.itemsize // (n * (1 if used[name] == P() else t))
            for name, value in params.items()}


def _cost_model(model: bool):
    """The collectives each form compiles to.

    As written (the StableHLO, and what other backends may keep): per layer
    one all-gather forward, one backward (layers 2.. only: no gradient flows
    into ``x``), one reduce-scatter of the gradient; one all-reduce of the
    loss; with a model axis Megatron's three all-reduces over it (after ``w2``
    and ``w4`` forward, out of ``w3`` backward). The shard_map
    form gathers a layer's weight and bias as one buffer; the jit form's
    partitioner gathers each parameter on its own. XLA's CPU pipeline (pinned
    here) of JAX 0.10 (XLA of 2025) drops the remat's optimization barriers
    and merges the shard_map form's backward re-gathers into the forward
    ones (JAX 0.12's keeps them, and the jit form keeps them in both); it
    writes the jit form's reduce-scatters as one combined all-reduce of
    the gradient blocks plus dynamic-slices. The explicit form defers the
    reduce-scatter across microbatches (:func:`_deferred_expectations`).
    """

    def fact(axes: Axes, args, form: str):
        params, x, _ = args
        data, model_axis = data_and_model_axes(axes, model)
        n = math.prod(axes.mesh.shape[name] for name in axis_tuple(data))
        t = axes.mesh.shape[model_axis] if model else 1
        blocks = _block_bytes(params, n, t)
        rows = x.shape[0] // n
        # Megatron's sums over the model axis: forward after w2 ([rows, h2])
        # and w4 ([rows, d_out]), backward out of w3 ([rows, h2]).
        h2, d_out = params["w2"].shape[1], params["w4"].shape[1]
        over_model = [rows * h2, rows * d_out, rows * h2] if model else []
        tp = sum(per_device_bytes("all-reduce", size * x.itemsize, t)
                 for size in over_model)
        layer = [blocks[f"w{k}"] + blocks[f"b{k}"] for k in range(1, N_LAYERS + 1)]
        gathered = (layer, layer[1:]) if form == "shard_map" else (
            list(blocks.values()), [blocks[f"w{k}"] for k in range(2, N_LAYERS + 1)])
        forward = sum(per_device_bytes("all-gather", b, n) for b in gathered[0])
        backward = sum(per_device_bytes("all-gather", b, n) for b in gathered[1])
        scatter = sum(per_device_bytes("reduce-scatter", b * n, n, whole=True)
                      for b in gathered[0])
        loss = per_device_bytes("all-reduce", x.itemsize, n)
        if form == "explicit":
            sizes = [axes.mesh.shape[name] for name in axis_tuple(data)]
            return _deferred_expectations(blocks, sizes, len(over_model),
                                          microbatch_count(rows), x.itemsize, tp)
        as_written = Expectation(
            {"all-gather": len(gathered[0]) + len(gathered[1]),
             "reduce-scatter": len(gathered[0]), "all-reduce": 1 + len(over_model)},
            {"all-gather": forward + backward, "reduce-scatter": scatter,
             "all-reduce": loss + tp})
        if compiled_for() != "cpu":
            return (as_written,)  # not pinned on GPU/TPU here: the program's
        if form == "shard_map":  # older CPU pipelines merge the re-gathers away
            return (as_written, Expectation(
                {"all-gather": N_LAYERS, "reduce-scatter": N_LAYERS,
                 "all-reduce": 1 + len(over_model)},
                {"all-gather": forward, "reduce-scatter": scatter,
                 "all-reduce": loss + tp}))
        # jit on CPU: the gradients' reduce-scatters are one all-reduce of
        # every gradient block (with the loss) and a dynamic-slice each.
        grads = per_device_bytes("all-reduce", x.itemsize + n * sum(blocks.values()), n)
        return Expectation(
            {"all-gather": len(gathered[0]) + len(gathered[1]),
             "all-reduce": 1 + len(over_model)},
            {"all-gather": forward + backward, "all-reduce": grads + tp})

    return fact


def _deferred_expectations(blocks: dict[str, int], sizes: list[int], sums: int,
                           m: int, itemsize: int, tp: float
                           ) -> tuple[Expectation, ...]:
    """The explicit form, the reduce-scatter deferred across ``m``
    microbatches: one all-gather of each parameter's block (to its layout as
    used, typed reduced over the data axis) and one reduce-scatter of each
    gradient for all microbatches, one all-reduce of the loss; Megatron's
    ``sums`` activation all-reduces over the model axis per microbatch (as
    many bytes in all, in ``sums`` to ``m * sums`` ops as XLA combines
    them). XLA:CPU writes the reduce-scatters, with the loss, as one
    all-reduce of the whole gradients plus dynamic-slices (from JAX 0.12.1
    one per data axis of ``sizes``, and the loss's apart:
    :func:`collectives._costs.unreduced_sum`)."""
    n = math.prod(sizes)
    gathers = sum(per_device_bytes("all-gather", b, n) for b in blocks.values())
    counts = range(sums, m * sums + 1)
    if compiled_for() == "cpu":
        reduces, grads = unreduced_sum(n * sum(blocks.values()), sizes,
                                       beside=itemsize)
        return tuple(Expectation(
            {"all-gather": len(blocks), "all-reduce": reduces + k},
            {"all-gather": gathers, "all-reduce": grads + tp}) for k in counts)
    scatter = sum(per_device_bytes("reduce-scatter", b * n, n, whole=True)
                  for b in blocks.values())
    loss = per_device_bytes("all-reduce", itemsize, n)
    return tuple(Expectation(
        {"all-gather": len(blocks), "reduce-scatter": len(blocks), "all-reduce": 1 + k},
        {"all-gather": gathers, "reduce-scatter": scatter, "all-reduce": loss + tp})
        for k in counts)


_FLOAT = frozenset({"float"})


def _recipe(name: str, summary: str, model: bool, label: str) -> Recipe:
    in_specs, out_specs = _specs(model)
    return Recipe(
        name=name, summary=summary,
        body=body_of(file.value_and_grad_per_device, model, False),
        pmap_body=body_of(file.value_and_grad_per_device, model, True),
        program=program_of(file.value_and_grad_program, model),
        explicit_program=deferred_program_of(
            file.value_and_grad_deferred_explicit_program, model),
        explicit_reason=deferred_sum_reason,
        oracle=on_axes(file.value_and_grad_numpy),
        in_specs=in_specs, out_specs=out_specs, example_shapes=_shapes(model),
        arg_names=("params", "x", "y"), n_terms=mlp_n_terms, dtype_kinds=_FLOAT,
        unsupported_reason=_needs_two_axes if model else lambda axes: None,
        check_vma=not model, family="strategy", cost_model=_cost_model(model),
        recipe_file="fsdp.py",
        # the MLP's four matmuls and squared loss (see dp_mlp)
        bitwise=False, exact_dtypes=WIDE_FLOATS,
        magnitudes=magnitudes_of(file.forward_backward),
        plan=mlp_plan(label, mesh_axes=2 if model else None, remat=True))


fsdp_mlp = register(_recipe(
    "fsdp_mlp", "MLP loss+grads, FSDP/ZeRO-3: params sharded on dim 0 over the "
    "data axis, all-gathered per layer, grads reduce-scattered", model=False,
    label="FSDP"))

fsdp_tp_mlp = register(_recipe(
    "fsdp_tp_mlp", "MLP loss+grads over axes (data, model): FSDP over data x "
    "Megatron TP on both layer pairs over model", model=True, label="FSDP x TP"))
