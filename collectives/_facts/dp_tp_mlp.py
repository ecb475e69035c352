"""A data- and tensor-parallel MLP: loss and gradients with explicit collectives.

The model of JAX's "distributed arrays" tutorial: four dense layers with relu
between them, ``predict = W4 relu(W3 relu(W2 relu(W1 x + b1) + b2) + b3) + b4``
(weights applied as ``x @ W``), mean-squared-error loss
``mean_over_batch(sum((predict(x) - y) ** 2, -1))`` and plain SGD. The
tutorial's sizes are ``[784, 8192, 8192, 8192, 10]`` with a batch of 8192;
here the sizes are parameters and the examples are small.

Layouts, on a mesh with a *data* axis and a *model* axis:

* data parallel: the batch is split over the data axis, every parameter is
  replicated; the gradients are summed over the data axis (``psum``).
* data x tensor parallel (Megatron on both layer pairs, ``(W1, W2)`` and
  ``(W3, W4)``): additionally ``W1`` and ``W3`` (with ``b1``, ``b3``) are
  split on their output dimension (column parallel) and ``W2``, ``W4`` on
  their input dimension (row parallel) over the model axis; ``b2`` and
  ``b4`` are replicated. Each device computes its columns of a pair's hidden
  layer, multiplies them by its rows of the pair's second weight and one
  ``psum`` over the model axis completes the pair's output (Megatron's
  ``g``). Backward, the gradient flowing out of ``W3`` into the second hidden
  layer needs the matching ``psum`` (Megatron's ``f``); none is needed before
  ``W1``, as no gradient flows into ``x``.

The explicit form of ``dp_tp_mlp`` accumulates two microbatches (where each
device's rows halve) with the data axis's sum deferred: the parameters
typed ``reduced`` over it, their ``unreduced`` gradient shares added on each
device and summed by one ``reshard`` (one all-reduce over the data axis for
all microbatches; JAX >= 0.9.1, ``check`` skips it before). ``dp_mlp``'s
runs the one-batch program.

The bodies, global programs and NumPy oracle are ``recipes/dp_tp_mlp.py``'s;
this module adds the facts the library needs about them, and the public
helpers (:func:`init_mlp`, :func:`mlp_loss`, :func:`mlp_specs`,
:func:`dp_tp_mlp_value_and_grad`) that validate, then call the file.

Recipes: ``dp_mlp`` takes the data axes as its collective axes (any mesh;
other mesh axes hold replicas). ``dp_tp_mlp`` communicates over two axes,
so both are its collective axes, in the order ``(data, model)``: on a 4x2
mesh ``axis=None`` (``("i", "j")``) is the tutorial's 4-way data x 2-way
model layout and ``("j", "i")`` is 2-way data x 4-way model. Naming both
matters: a per-device body only knows the axis names it is given, and under
the pmap form the other mesh axes are vmapped where nothing can look them up.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.sharding import PartitionSpec as P

from collectives._costs import per_device_bytes
from collectives._facts.dp_grads import deferred_sum_reason
from collectives._facts.dp_grads import microbatch_count
from collectives._layout import Axes
from collectives._layout import axis_tuple
from collectives._layout import body_axis_size
from collectives._layout import on_axes
from collectives._presentation import PlanSpec
from collectives._presentation import UnitBoundary
from collectives._recipe import WIDE_FLOATS
from collectives._recipe import Recipe
from collectives._registry import register
from collectives.hlo import Expectation
from collectives.recipes import dp_tp_mlp as file

Params = dict[str, Any]


def mlp_specs(model_axis: str | None = None) -> dict[str, P]:
    """The ``PartitionSpec`` of every MLP parameter for tensor parallelism.

    Args:
      model_axis: the mesh axis that splits ``w1``/``b1`` and ``w3``/``b3``
        by columns and ``w2``, ``w4`` by rows (``b2``, ``b4`` replicated);
        ``None`` replicates every parameter (data parallel).

    Returns:
      A dict from parameter name to spec; the batch itself is ``P(data_axis)``.

    Examples:
      >>> import jax
      >>> import collectives as cx
      >>> specs = cx.mlp_specs("model")
      >>> specs["w1"] == jax.P(None, "model"), specs["w2"] == jax.P("model")
      (True, True)
      >>> specs["b2"] == jax.P()
      True
    """
    return file.param_specs(model_axis)


def init_mlp(sizes: Sequence[int], *, seed: int = 0, dtype: Any = "float32"
             ) -> Params:
    """Random MLP parameters as NumPy arrays (weights scaled by ``1/sqrt(fan_in)``).

    Args:
      sizes: the five layer widths ``(d_in, h1, h2, h3, d_out)``, e.g. the
        tutorial's ``(784, 8192, 8192, 8192, 10)``; for tensor parallelism
        ``h1`` and ``h3`` must divide by the model axis size.
      seed: seed of the NumPy generator.
      dtype: the parameters' dtype.

    Returns:
      ``{"w1": [d_in, h1], "b1": [h1], ..., "w4": [h3, d_out], "b4": [d_out]}``.

    Raises:
      ValueError: ``sizes`` is not five positive ints.

    Examples:
      >>> import collectives as cx
      >>> params = cx.init_mlp((4, 8, 8, 8, 2))
      >>> params["w3"].shape, params["b4"].shape
      ((8, 8), (2,))
    """
    sizes = tuple(sizes)
    if len(sizes) != 5 or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(
            f"sizes: expected five positive ints (d_in, h1, h2, h3, d_out), got "
            f"{sizes!r}. Fix: e.g. (784, 8192, 8192, 8192, 10).")
    return file.init_params(sizes, seed=seed, dtype=dtype)


def mlp_loss(params: Params, x, y):
    """The full-batch loss ``mean_over_batch(sum((predict(x) - y) ** 2, -1))``.

    Global view: call it under ``jit`` (the jit form) or on one device.

    Args:
      params: as from :func:`init_mlp`.
      x: the inputs, ``[batch, d_in]``.
      y: the targets, ``[batch, d_out]``.

    Returns:
      A scalar.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> params = cx.init_mlp((3, 4, 4, 4, 2))
      >>> x, y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)
      >>> loss, grads = jax.jit(jax.value_and_grad(cx.mlp_loss))(params, x, y)
      >>> loss.shape, grads["w2"].shape
      ((), (4, 4))
    """
    return file.mlp_loss(params, x, y)


def dp_tp_mlp_value_and_grad(params: Params, x, y, *, data_axis,
                             model_axis: str | None = None):
    """Loss and gradients of the MLP with explicit collectives; call inside a body.

    Forward and backward are written out by hand, so every collective is in
    view: ``psum`` over the model axis after ``W2`` and after ``W4``
    (forward) and out of ``W3`` (backward), and ``psum`` of the loss and the
    gradients over the data axis.

    Args:
      params: this device's parameters: ``w1 [d_in, h1/t]``, ``b1 [h1/t]``,
        ``w2 [h1/t, h2]``, ``w3 [h2, h3/t]``, ``b3 [h3/t]`` and
        ``w4 [h3/t, d_out]`` are blocks over ``model_axis`` (``t`` devices),
        ``b2`` and ``b4`` whole (see :func:`mlp_specs`).
      x: this device's rows of the batch, ``[b, d_in]``.
      y: the matching targets, ``[b, d_out]``.
      data_axis: the mesh axis (or tuple) that splits the batch.
      model_axis: the mesh axis that splits ``w1``, ``b1``, ``w2``, ``w3``,
        ``b3`` and ``w4``, or ``None`` for pure data parallelism.

    Returns:
      ``(loss, grads)``: the full-batch loss and gradients shaped like
      ``params`` (blocks where the parameter is a block), identical on every
      device of the data axis.

    Examples:
      >>> import functools, jax, numpy as np
      >>> import collectives as cx
      >>> mesh = cx.make_mesh((4, 2), ("data", "model"))
      >>> params = cx.init_mlp((3, 4, 4, 4, 2))
      >>> x = np.ones((8, 3), np.float32)
      >>> y = np.zeros((8, 2), np.float32)
      >>> body = functools.partial(cx.dp_tp_mlp_value_and_grad, data_axis="data",
      ...                          model_axis="model")
      >>> specs = cx.mlp_specs("model")
      >>> f = jax.jit(jax.shard_map(
      ...     body, mesh=mesh, in_specs=(specs, jax.P("data"), jax.P("data")),
      ...     out_specs=(jax.P(), specs)))
      >>> loss, grads = f(params, x, y)
      >>> want = jax.jit(jax.value_and_grad(cx.mlp_loss))(params, x, y)
      >>> bool(np.allclose(loss, want[0], rtol=1e-5))
      True
      >>> bool(np.allclose(grads["w3"], want[1]["w3"], rtol=1e-5, atol=1e-6))
      True
    """
    body_axis_size(data_axis, "dp_tp_mlp_value_and_grad")
    if model_axis is not None:
        body_axis_size(model_axis, "dp_tp_mlp_value_and_grad")
    return file.value_and_grad_per_device(params, x, y, data_axis, model_axis)


# -- tolerance facts ---------------------------------------------------------

class TermNorms(np.lib.mixins.NDArrayOperatorsMixin):
    """An array whose every element holds ``sum |term| ** power`` over the
    terms of a sum of products, the value a NumPy oracle's arithmetic would
    give as a sum: run an oracle's forward and backward pass on these
    (``+``, ``-``, ``*``, ``/``, ``@``, ``**``, ``.T``, ``.sum``, relu as
    ``np.maximum(z, 0)`` and its mask ``z > 0``) and each result holds the
    ``power``-norm of its terms, raised to ``power``.

    The rules: a constant ``c`` enters as ``|c| ** power``; a difference
    has its operands' terms (subtraction becomes addition); products,
    quotients and matmuls multiply the norms (``|a b| ** p = |a| ** p |b| **
    p``, summed over the matmul's terms); an integer power ``k`` of a sum
    expands into products of ``k`` terms, ``E ** k``; relu passes its input
    through and its mask passes everything (a term need not survive the
    relu to be rounded)."""

    def __init__(self, value, power: int):
        self.value, self.power = np.asarray(value, np.float64), power

    @classmethod
    def of(cls, a, power: int) -> TermNorms:
        """``a``'s elements as single terms: ``|a| ** power``."""
        return cls(np.abs(np.asarray(a, np.float64)) ** power, power)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def T(self) -> TermNorms:  # ndarray's name
        return TermNorms(self.value.T, self.power)

    def sum(self, axis=None) -> TermNorms:
        return TermNorms(self.value.sum(axis), self.power)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            return NotImplemented
        norms = [(a if isinstance(a, TermNorms) else TermNorms.of(a, self.power)).value
                 for a in inputs]
        if ufunc in (np.add, np.subtract):
            value = norms[0] + norms[1]
        elif ufunc in (np.multiply, np.true_divide, np.matmul):
            value = ufunc(norms[0], norms[1])
        elif ufunc is np.negative or (ufunc is np.maximum and np.all(inputs[1] == 0)):
            value = norms[0]  # -a, and relu: the same terms
        elif ufunc is np.greater and np.all(inputs[1] == 0):
            value = np.ones_like(norms[0])  # relu's mask: every term passes
        elif ufunc is np.power and float(inputs[1]).is_integer():
            value = norms[0] ** inputs[1]
        else:
            raise TypeError(f"TermNorms: no rule for {ufunc.__name__}")
        return TermNorms(value, self.power)


def term_norms(forward_backward: Callable[..., Any], params: Params, x, y, *,
               power: int) -> tuple[np.ndarray, Params]:
    """For each loss and gradient element of a recipe file's
    ``forward_backward(params, x, y)``, ``(sum |term| ** power) ** (1/power)``
    over the terms of its sum of products (see :class:`TermNorms`).
    ``power=1`` gives the sum of the terms' magnitudes, which bounds the
    oracle elementwise; ``power=2`` their root-sum-square."""
    def norms(a):
        return TermNorms.of(a, power)

    loss, grads = forward_backward({k: norms(v) for k, v in params.items()},
                                   norms(x), norms(y))
    root = 1.0 / power
    return loss.value ** root, {name: g.value ** root for name, g in grads.items()}


def magnitudes_of(forward_backward: Callable[..., Any]) -> Callable[..., Any]:
    """The MLP recipes' ``magnitudes`` fact: for each loss and gradient
    element, the root-sum-square of the terms behind it, by the oracle's
    arithmetic on squared values (:func:`term_norms`, ``power=2``).

    Four layers multiply their inputs, so a gradient element that cancels to
    near zero keeps the rounding of terms far larger than itself. Rounding
    errors of terms with mixed signs add like a random walk, so their size
    follows the root-sum-square of the terms, not their sum: on Gaussian
    data most gradients cancel, and an ``atol`` scaled by the sum of
    ``|term|`` would let a 10 % error through in most elements."""
    def magnitudes(params: Params, x, y, *, axes: Axes):
        del axes
        return term_norms(forward_backward, params, x, y, power=2)
    return magnitudes


mlp_magnitudes = magnitudes_of(file.forward_backward)


# -- recipes ---------------------------------------------------------------
# Arguments (params, x, y), global view; outputs (loss, grads) with the
# gradients laid out like the parameters.

def data_and_model_axes(axes: Axes, model: bool):
    """(data axis entry, model axis or None) of a recipe over ``axes``."""
    if model:
        return axes.names[0], axes.names[1]
    return axes.entry, None


def needs_data_and_model_axes(layout: str):
    """``unsupported_reason`` of a recipe over two collective axes (data,
    model); ``layout`` says what each axis splits."""

    def reason(axes: Axes) -> str | None:
        if len(axes.names) == 2:
            return None
        return (f"needs two collective axes in the order (data, model): {layout}; "
                "e.g. a 4x2 mesh with axis=None or ('i', 'j')")

    return reason


_needs_two_axes = needs_data_and_model_axes(
    "the batch is split over the first, W1/b1 and W3/b3 by columns and W2, W4 "
    "by rows over the second")


def loss_and_grads_specs(param_specs, model: bool):
    """``(in_specs, out_specs)`` of a ``(params, x, y) -> (loss, grads)``
    recipe: params laid out by ``param_specs(data, model_axis)``, the batch
    split over the data axes; the loss replicated, the grads laid out as the
    params."""
    def in_specs(axes: Axes):
        data, model_axis = data_and_model_axes(axes, model)
        return (param_specs(data, model_axis), P(data), P(data))

    def out_specs(axes: Axes):
        return (P(), in_specs(axes)[0])

    return in_specs, out_specs


def _specs(model: bool):
    return loss_and_grads_specs(lambda data, model_axis: mlp_specs(model_axis), model)


def _shapes(model: bool):
    def shapes(axes: Axes, dims):
        data, model_axis = data_and_model_axes(axes, model)
        b, h = (tuple(dims) * 2)[:2]
        batch = b * math.prod(axes.mesh.shape[n] for n in axis_tuple(data))
        hidden = h * (axes.mesh.shape[model_axis] if model else 1)
        sizes = (3, hidden, hidden, hidden, 2)
        params = {}
        for layer in range(1, 5):
            fan_in, fan_out = sizes[layer - 1], sizes[layer]
            params[f"w{layer}"], params[f"b{layer}"] = (fan_in, fan_out), (fan_out,)
        return (params, (batch, sizes[0]), (batch, sizes[-1]))
    return shapes


def body_of(value_and_grad_per_device: Callable[..., Any], model: bool,
            *options: Any) -> Callable[..., Any]:
    """A recipe file's ``value_and_grad_per_device(params, x, y, data_axis,
    model_axis, *options)`` as a recipe's body over ``axis``: ``(data,
    model)``, or the data axes alone."""
    @functools.wraps(value_and_grad_per_device)
    def body(params, x, y, *, axis):
        data, model_axis = axis if model else (axis, None)
        return value_and_grad_per_device(params, x, y, data, model_axis, *options)
    return body


def program_of(value_and_grad_program: Callable[..., Any], model: bool,
               with_mesh: bool = True) -> Callable[..., Any]:
    """A recipe file's ``value_and_grad_program(params, x, y, mesh, data_axis,
    model_axis)`` as a recipe's program over ``axes``; ``with_mesh=False``
    for an explicit program, ``(params, x, y, data_axis, model_axis)``,
    whose mesh is the one in scope."""
    @functools.wraps(value_and_grad_program)
    def program(params, x, y, *, axes: Axes):
        data, model_axis = data_and_model_axes(axes, model)
        mesh = (axes.mesh,) if with_mesh else ()
        return value_and_grad_program(params, x, y, *mesh, data, model_axis)
    return program


def deferred_program_of(deferred_program: Callable[..., Any], model: bool
                        ) -> Callable[..., Any]:
    """A recipe file's ``value_and_grad_deferred_explicit_program(params, x,
    y, data_axis, model_axis, n_micro)`` as a recipe's explicit program over
    ``axes``: two microbatches where each device's rows halve (else one),
    their gradient sum over the data axis deferred to one ``reshard``."""
    @functools.wraps(deferred_program)
    def program(params, x, y, *, axes: Axes):
        data, model_axis = data_and_model_axes(axes, model)
        n = math.prod(axes.mesh.shape[name] for name in axis_tuple(data))
        return deferred_program(params, x, y, data, model_axis,
                                n_micro=microbatch_count(np.shape(x)[0] // n))
    return program


mlp_oracle = on_axes(file.value_and_grad_numpy)


def mlp_n_terms(axes: Axes) -> int:
    """The MLP recipes' ``n_terms``: the roundings along one path through
    the network, a product and a sum in each of its eight matmuls (four
    forward, four back). The widths of those sums and the batch need no count
    of their own: ``magnitudes`` scales ``atol`` per element by the
    root-sum-square of the terms, the size their rounding errors reach."""
    del axes
    return 16


_FLOAT = frozenset({"float"})


def _mlp_fact(model: bool):
    """Every form: one all-reduce over the data axis of the loss and every
    gradient block (XLA combines them); with TP, three more over the model
    axis, of activations: the forward sums after W2 (``[rows, h2]``) and
    after W4 (``[rows, d_out]``), and the transpose of the first, the
    gradient out of W3 (``[rows, h2]``). No gradient flows into ``x``, so
    none comes out of W1. The explicit form (``dp_tp_mlp``'s, the deferred
    sum over microbatches) sends the same bytes: one data-axis all-reduce
    for all microbatches, the model axis's sums split among them."""

    def fact(axes: Axes, args: tuple[Any, ...], form: str
             ) -> Expectation | tuple[Expectation, ...]:
        params, x, _ = args
        item = np.asarray(x).dtype.itemsize
        if not model:
            size = (1 + sum(np.size(v) for v in params.values())) * item
            return Expectation({"all-reduce": 1},
                               {"all-reduce": per_device_bytes("all-reduce", size,
                                                               axes.size)})
        data, width = (axes.mesh.shape[name] for name in axes.names)
        specs = file.param_specs(file.MODEL)
        blocks = sum(np.size(v) // (1 if specs[k] == P() else width)
                     for k, v in params.items())
        rows = np.shape(x)[0] // data
        h2, d_out = np.shape(params["w2"])[1], np.shape(params["w4"])[1]
        over_model = [rows * h2, rows * d_out, rows * h2]  # the sums' elements
        sent = (per_device_bytes("all-reduce", (1 + blocks) * item, data)
                + sum(per_device_bytes("all-reduce", n * item, width)
                      for n in over_model))
        if form != "explicit":
            return Expectation({"all-reduce": 1 + len(over_model)},
                               {"all-reduce": sent})
        # The explicit form runs m microbatches (the deferred sum): the data
        # axis's all-reduce is still one, the model axis's sums are each
        # microbatch's, as many bytes in all, in 3 to 3 m ops as XLA
        # combines them.
        m = microbatch_count(rows)
        return tuple(Expectation({"all-reduce": 1 + k}, {"all-reduce": sent})
                     for k in range(len(over_model), m * len(over_model) + 1))

    return fact

def plan_mlp_shapes(axes: Axes, model) -> tuple[Any, ...]:
    """One unit of ``model`` for the MLP strategies: two blocks' MLPs (four
    layers, ``width -> ffn -> width`` twice), on every token of a step
    (``[batch * seq, width]`` inputs and targets)."""
    del axes
    w, f = model.width, model.ffn
    params = {}
    for layer, (fan_in, fan_out) in enumerate(((w, f), (f, w), (w, f), (f, w)), 1):
        params[f"w{layer}"], params[f"b{layer}"] = (fan_in, fan_out), (fan_out,)
    return (params, (model.tokens, w), (model.tokens, w))


def mlp_activations(model: bool, remat: bool):
    """``PlanSpec.activations`` of a two-block MLP strategy: what one device
    keeps for the backward pass, per unit, for ``t`` tokens (the step's over
    every device, or over the data axis with a model axis of ``m``; the
    hidden width ``F`` split over it, Megatron's way):

    * as written, no rematerialization (DP, DP x TP): each layer's
      pre-activation and output, ``t (4 F/m + 4 D)`` a unit;
    * each layer rematerialized from one kept tensor a layer (FSDP's recipe
      keeps the pre-activations, ``jax.checkpoint``), ``t (2 F/m + 2 D)`` a
      unit, plus one layer's working set while it is recomputed.
    """
    def kept(axes, model_: Any, remat_now: bool, schedule: str = "gpipe") -> float:
        del schedule  # one program, no pipeline
        tokens, m = _split(axes, model_, model)
        units = model_.layers / 2
        hidden, width = model_.ffn / m, model_.width
        if remat or remat_now:
            return tokens * (units * (2 * hidden + 2 * width)
                             + 2 * max(hidden, width))
        return tokens * units * (4 * hidden + 4 * width)

    return kept


def _split(axes, model_, model: bool) -> tuple[float, int]:
    """``(t, m)``: the tokens one device computes on (the step's over the
    devices that split the batch: every device, or the data axis with a
    model axis) and the tensor-parallel degree (the model axis, or 1)."""
    if model:
        return model_.tokens / axes.shape[0], axes.shape[-1]
    return model_.tokens / axes.size, 1


def mlp_boundary(model: bool, gathers: bool):
    """``PlanSpec.boundary`` of a two-block MLP strategy: a unit inside the
    model also computes its first layer's input gradient (``2 t D F/m``
    FLOPs), which Megatron sums over the model axis (one all-reduce of
    ``[t, D]``); with ``gathers`` (FSDP) it gathers that layer's weights
    again for it: the shard_map form gathers weight and bias as one buffer,
    the jit form the weight alone, over the data axis (with a model axis) or
    every axis."""
    def extra(axes, model_: Any, form: str) -> UnitBoundary:
        w, f, itemsize = model_.width, model_.ffn, model_.itemsize
        tokens, m = _split(axes, model_, model)
        ops = []
        if model:
            ops.append(("all-reduce", per_device_bytes(
                "all-reduce", tokens * w * itemsize, m), (axes.names[-1],)))
        if gathers:
            n = axes.shape[0] if model else axes.size
            block = (w * f + (f if form == "shard_map" else 0)) / (n * m) * itemsize
            ops.append(("all-gather", per_device_bytes("all-gather", block, n),
                        (axes.names[0],) if model else None))
        return UnitBoundary(flops=2 * tokens * w * f / m, ops=tuple(ops))

    return extra


def mlp_plan(label: str, mesh_axes: int | None = None, *,
             remat: bool = False) -> PlanSpec:
    """The :class:`PlanSpec` of an MLP strategy: ``layers / 2`` units of two
    blocks per step, each stored. With two mesh axes the last is the model
    axis, whose activation sums the layers wait for; ``remat``: the recipe
    rematerializes each layer (FSDP), whose gathers then overlap every
    layer's computation, not only the backward pass."""
    per_step = lambda axes, model: model.layers / 2
    return PlanSpec(label=label, shapes=plan_mlp_shapes,
                    unit="2 blocks' MLPs (4 layers), loss and gradients",
                    repeats=per_step,
                    stored=per_step, mesh_axes=mesh_axes,
                    serial="last" if mesh_axes == 2 else "none",
                    overlap="compute" if remat else "backward",
                    activations=mlp_activations(mesh_axes == 2, remat),
                    boundary=mlp_boundary(mesh_axes == 2, gathers=remat))


dp_tp_mlp = register(Recipe(
    name="dp_tp_mlp", family="strategy", recipe_file="dp_tp_mlp.py",
    cost_model=_mlp_fact(model=True),
    # four matmuls and a squared loss: past 2**24 even float32 rounds, and
    # float16 overflows on small integers
    bitwise=False, exact_dtypes=WIDE_FLOATS, magnitudes=mlp_magnitudes,
    summary="MLP loss+grads over axes (data, model): batch split over data, "
            "Megatron TP on both layer pairs over model",
    body=body_of(file.value_and_grad_per_device, model=True),
    program=program_of(file.value_and_grad_program, model=True), oracle=mlp_oracle,
    explicit_program=deferred_program_of(
        file.value_and_grad_deferred_explicit_program, model=True),
    explicit_reason=deferred_sum_reason,
    in_specs=_specs(model=True)[0], out_specs=_specs(model=True)[1],
    example_shapes=_shapes(model=True), arg_names=("params", "x", "y"),
    n_terms=mlp_n_terms, dtype_kinds=_FLOAT, unsupported_reason=_needs_two_axes,
    plan=mlp_plan("DP x TP", mesh_axes=2)))

dp_mlp = register(Recipe(
    name="dp_mlp", family="strategy", recipe_file="dp_tp_mlp.py",
    cost_model=_mlp_fact(model=False),
    bitwise=False, exact_dtypes=WIDE_FLOATS, magnitudes=mlp_magnitudes,
    summary="MLP loss+grads, data parallel: batch split, params replicated, "
            "grads psum",
    body=body_of(file.value_and_grad_per_device, model=False),
    program=program_of(file.value_and_grad_program, model=False), oracle=mlp_oracle,
    explicit_program=program_of(file.value_and_grad_explicit_program, model=False,
                                with_mesh=False),
    in_specs=_specs(model=False)[0], out_specs=_specs(model=False)[1],
    example_shapes=_shapes(model=False), arg_names=("params", "x", "y"),
    n_terms=mlp_n_terms, dtype_kinds=_FLOAT, plan=mlp_plan("DP")))
