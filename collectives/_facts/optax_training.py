"""Data-parallel training with a real optimiser: N ``optax.adam`` steps.

The linear model of ``dp_grads`` (``y ~ x @ w + b``, mean squared error),
the batch split by rows over the data axis, the parameters *and the Adam
state* replicated. Each step averages the per-device gradients (``pmean``)
and every device applies the same Adam update, so the parameters stay
identical across devices and equal single-device training on the whole batch.
The recipe ``dp_adam`` returns ``(losses, params)``: the loss before each of
the ``N`` steps and the parameters after them.

The n x gradient trap, with an optimiser: ``jax.grad`` inside a shard_map
body of *replicated* (invariant) parameters already sums the gradient over
the devices; a ``pmean`` after it leaves the sum, ``n`` times the right
gradient (see ``dp_grads``). Adam hides the mistake: its update
``m / (sqrt(v) + eps)`` does not change when every gradient is scaled by
``n``, so the loss curve looks right. Anything that reads the gradient's
scale exposes it: gradient clipping (``optax.clip_by_global_norm``), SGD,
``eps`` when gradients are small, logged gradient norms.
``recipes/optax_training.py``'s ``adam_step_per_device`` takes
``vary=False`` to show it.

float16 parameters are refused: Adam's ``eps`` (1e-8) is below float16's
smallest subnormal and rounds to 0, so every zero gradient element becomes
``0 / 0 = NaN`` in the update. Keep the parameters and the Adam state in
float32 (bfloat16, with float32's exponent range, holds ``eps``).

The explicit form is gradient accumulation with the sum deferred
(``train_deferred_program``): each step splits the batch into two
microbatches (where each device's rows halve), takes their gradients at
parameters typed ``reduced`` over the data axis, adds the ``unreduced``
shares on each device and sums them with one ``reshard``: one all-reduce a
step, where summing each microbatch's gradient as it is taken
(``train_microbatches_program``) sends twice the bytes. JAX before 0.9.1
refuses it; ``check`` shows the explicit form skipped there.

The bodies, global program and NumPy oracle are
``recipes/optax_training.py``'s, run with this recipe's ``N_STEPS`` and
``LR``; this module adds the facts the library needs about them.

optax is an optional dependency (the ``train`` extra): the
recipe file, which imports it, is imported on first use, so ``import
collectives`` works without it; the forms raise
:class:`OptionalDependencyError` then, and ``python -m collectives check``
reports the recipe as skipped.
"""

from __future__ import annotations

import jax
import numpy as np

from collectives._costs import per_device_bytes
from collectives._costs import unreduced_sum
from collectives._facts.dp_grads import check_grads_args
from collectives._facts.dp_grads import deferred_sum_reason
from collectives._facts.dp_grads import grads_shapes
from collectives._facts.dp_grads import mesh_sizes
from collectives._facts.dp_grads import microbatch_count
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._recipe import WIDE_FLOATS
from collectives._recipe import Recipe
from collectives._recipe import UnsupportedDtypeError
from collectives._registry import register
from collectives.hlo import Expectation

N_STEPS = 5
LR = 0.01
EPS = 1e-8  # optax.adam's default


class OptionalDependencyError(ImportError):
    """A recipe needs a package that is not installed (e.g. optax)."""


def require_optax():
    """``import optax``, or an :class:`OptionalDependencyError` saying how to
    install it."""
    try:
        import optax
    except ImportError:
        raise OptionalDependencyError(
            "the training recipes need optax, which is not installed. Fix: pip "
            "install optax (jax-collectives' 'train' extra; in a checkout: pip "
            "install '.[train]').") from None
    return optax


def training_file():
    """``recipes/optax_training.py`` (``collectives.recipes.optax_training``),
    imported on first use: it imports optax, an optional dependency."""
    require_optax()
    from collectives.recipes import optax_training
    return optax_training


class _FromFile:
    """The file's function ``name`` with this recipe's ``n_steps`` and ``lr``
    (and ``fixed``): a body keeps its ``axis=``, a program or oracle drops
    ``axes=``. The file is imported on the first call; ``__wrapped__`` (what
    ``python -m collectives show`` prints) is the file's function."""

    def __init__(self, name: str, **fixed):
        self.__name__, self.fixed = name, fixed

    @property
    def __wrapped__(self):
        return getattr(training_file(), self.__name__)

    def __call__(self, *args, axes: Axes | None = None, **kwargs):
        return self.__wrapped__(*args, n_steps=N_STEPS, lr=LR, **self.fixed,
                                **kwargs)


class _Deferred(_FromFile):
    """The file's deferred explicit program, with this recipe's ``n_steps``
    and ``lr``, on two microbatches where each device's rows halve."""

    def __call__(self, params, x, y, *, axes: Axes):
        rows = np.shape(x)[0] // axes.size
        return self.__wrapped__(params, x, y, n_steps=N_STEPS, lr=LR,
                                n_micro=microbatch_count(rows))


def _check_dtypes(axes: Axes, args) -> None:
    check_grads_args(axes, args)
    dtypes = {np.dtype(jax.dtypes.result_type(v)).name for v in args[0].values()}
    if "float16" in dtypes:
        raise UnsupportedDtypeError(
            f"dp_adam: argument params has dtype float16: Adam's eps ({EPS:g}) "
            "rounds to 0 in float16, so a zero gradient element updates by 0 / 0 "
            "= NaN. Fix: keep params (and so the Adam state) in float32, or "
            "bfloat16, and cast inside the model for mixed precision.")


def _n_terms(axes: Axes) -> int:
    # Per step, a gradient element is within dp_grads' rounding bound
    # (4 (4n + 8) terms); Adam's update m / sqrt(v) is a ratio of the
    # gradients, so its relative error is at most about twice theirs (while
    # no gradient element is near zero, which holds for N = 5 small steps
    # from drawn data); the errors of N steps add up.
    return 2 * N_STEPS * 4 * (4 * axes.size + 8)


def _cost_model(axes: Axes, args, form: str) -> Expectation:
    """Inside the scan (one while loop): one all-reduce per step of the loss
    and the gradients together (XLA combines them); the HLO text holds it
    once. The Adam state never moves: every device updates its copy. The
    explicit form's deferred sum of the gradients: one all-reduce per data
    axis, and the loss's apart, from JAX 0.12.1
    (:func:`collectives._costs.unreduced_sum`)."""
    params, x, _ = args
    grads = sum(np.size(v) for v in params.values()) * x.itemsize
    if form == "explicit":
        count, sent = unreduced_sum(grads, mesh_sizes(axes), beside=x.itemsize)
        return Expectation({"all-reduce": count}, {"all-reduce": sent})
    return Expectation({"all-reduce": 1}, {"all-reduce": per_device_bytes(
        "all-reduce", grads + x.itemsize, axes.size)})


dp_adam = register(Recipe(
    name="dp_adam",
    summary=f"data-parallel training: {N_STEPS} optax.adam steps on averaged "
            "gradients, params and Adam state replicated",
    body=_FromFile("train_per_device"),
    pmap_body=_FromFile("train_per_device", vary=False),
    program=_FromFile("train_program"), oracle=_FromFile("train_numpy"),
    explicit_program=_Deferred("train_deferred_program"),
    explicit_reason=deferred_sum_reason,
    in_specs=lambda axes: (make_spec(), make_spec(axes.entry), make_spec(axes.entry)),
    out_specs=lambda axes: (make_spec(), make_spec()),
    example_shapes=grads_shapes, arg_names=("params", "x", "y"), n_terms=_n_terms,
    dtype_kinds=frozenset({"float"}), validate=_check_dtypes, family="strategy",
    bitwise=False,  # Adam divides by a square root: rounds on any input
    exact_dtypes=WIDE_FLOATS,  # float16 is refused
    cost_model=_cost_model, recipe_file="optax_training.py"))
