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
:func:`adam_step_body` takes ``trap=True`` to show it.

float16 parameters are refused: Adam's ``eps`` (1e-8) is below float16's
smallest subnormal and rounds to 0, so every zero gradient element becomes
``0 / 0 = NaN`` in the update. Keep the parameters and the Adam state in
float32 (bfloat16, with float32's exponent range, holds ``eps``).

optax is an optional dependency (``pip install collectives[train]``): it is
imported inside the functions that use it, so ``import collectives`` works
without it; the forms raise :class:`OptionalDependencyError` then, and
``python -m collectives check`` reports the recipe as skipped.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax

from collectives import _compat
from collectives._costs import per_device_bytes
from collectives._facts.grads import _check_args
from collectives._facts.grads import _shapes
from collectives._facts.grads import mse
from collectives._layout import Axes
from collectives._layout import make_spec
from collectives._recipe import WIDE_FLOATS
from collectives._recipe import Recipe
from collectives._recipe import UnsupportedDtypeError
from collectives._registry import register
from collectives.hlo import Expectation

N_STEPS = 5
LR = 0.01
B1, B2, EPS = 0.9, 0.999, 1e-8  # optax.adam's defaults


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
            "install 'collectives[train]' (or pip install optax).") from None
    return optax


def adam_step_body(params, opt_state, x, y, *, axis, optimizer, trap=False,
                   vary=True):
    """One data-parallel optimiser step; call inside a body.

    Args:
      params: the replicated parameters ``{"w": [d, o], "b": [o]}``.
      opt_state: the replicated optimiser state.
      x: this device's rows ``[k, d]``; y: ``[k, o]``.
      axis: the data axis (or tuple).
      optimizer: an ``optax.GradientTransformation``.
      trap: take ``jax.grad`` at the invariant parameters (the n x trap
        under shard_map's ``check_vma``) instead of marking them varying.
      vary: mark the parameters varying before ``jax.grad`` (shard_map);
        ``False`` under pmap, which has no varying types.

    Returns:
      ``(loss, params, opt_state)`` after the step, replicated.
    """
    optax = require_optax()
    local = params
    if vary and not trap:
        local = jax.tree_util.tree_map(lambda p: _compat.pvary(p, axis), params)
    loss, grads = jax.value_and_grad(mse)(local, x, y)
    loss, grads = lax.pmean((loss, grads), axis)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def _train_body(vary: bool):
    def body(params, x, y, *, axis):
        # params: replicated; x: [k, d], y: [k, o] on each device
        optimizer = require_optax().adam(LR)
        step = functools.partial(adam_step_body, x=x, y=y, axis=axis,
                                 optimizer=optimizer, vary=vary)

        def scan_step(carry, _):
            loss, params, opt_state = step(*carry)
            return (params, opt_state), loss

        start = (params, optimizer.init(params))
        (params, _), losses = lax.scan(scan_step, start, None, length=N_STEPS)
        return losses, params
    return body


def _program(params, x, y, *, axes: Axes):
    # The global loop: jit all-reduces each step's gradient over the rows.
    del axes
    optax = require_optax()
    optimizer = optax.adam(LR)

    def scan_step(carry, _):
        params, opt_state = carry
        loss, grads = jax.value_and_grad(mse)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), losses = lax.scan(scan_step, (params, optimizer.init(params)),
                                   None, length=N_STEPS)
    return losses, params


def adam_numpy(params, x, y, n_steps: int = N_STEPS, lr: float = LR):
    """The NumPy oracle: ``n_steps`` of Adam on the full batch, in float64.

    Returns:
      ``(losses, params)``: the loss before each step, the final parameters.
    """
    w, b = (np.asarray(params[k], np.float64) for k in ("w", "b"))
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    moments = [[np.zeros_like(a), np.zeros_like(a)] for a in (w, b)]  # m, v
    losses = []
    for t in range(1, n_steps + 1):
        residual = x @ w + b - y
        losses.append(np.mean(residual ** 2))
        scale = 2.0 / residual.size
        grads = (scale * x.T @ residual, scale * residual.sum(0))
        new = []
        for value, grad, (m, v) in zip((w, b), grads, moments, strict=True):
            m[...] = B1 * m + (1 - B1) * grad
            v[...] = B2 * v + (1 - B2) * grad ** 2
            m_hat, v_hat = m / (1 - B1 ** t), v / (1 - B2 ** t)
            new.append(value - lr * m_hat / (np.sqrt(v_hat) + EPS))
        w, b = new
    return np.asarray(losses), {"w": w, "b": b}


def _check_dtypes(axes: Axes, args) -> None:
    _check_args(axes, args)
    dtypes = {np.dtype(jax.dtypes.result_type(v)).name for v in args[0].values()}
    if "float16" in dtypes:
        raise UnsupportedDtypeError(
            f"dp_adam: argument params has dtype float16: Adam's eps ({EPS:g}) "
            "rounds to 0 in float16, so a zero gradient element updates by 0 / 0 "
            "= NaN. Fix: keep params (and so the Adam state) in float32, or "
            "bfloat16, and cast inside the model for mixed precision.")


def _oracle(params, x, y, *, axes: Axes):
    del axes
    losses, trained = adam_numpy(params, x, y)
    return losses.astype(x.dtype), {k: v.astype(x.dtype) for k, v in trained.items()}


def _n_terms(axes: Axes) -> int:
    # Per step, a gradient element is within dp_grads' rounding bound
    # (4 (4n + 8) terms); Adam's update m / sqrt(v) is a ratio of the
    # gradients, so its relative error is at most about twice theirs (while
    # no gradient element is near zero, which holds for N = 5 small steps
    # from drawn data); the errors of N steps add up.
    return 2 * N_STEPS * 4 * (4 * axes.size + 8)


def _hlo(axes: Axes, args, form: str) -> Expectation:
    """Inside the scan (one while loop): one all-reduce per step of the loss
    and the gradients together (XLA combines them); the HLO text holds it
    once. The Adam state never moves: every device updates its copy."""
    del form
    params, x, _ = args
    size = (1 + sum(np.size(v) for v in params.values())) * x.itemsize
    return Expectation({"all-reduce": 1},
                       {"all-reduce": per_device_bytes("all-reduce", size, axes.size)})


dp_adam = register(Recipe(
    name="dp_adam",
    summary=f"data-parallel training: {N_STEPS} optax.adam steps on averaged "
            "gradients, params and Adam state replicated",
    body=_train_body(vary=True), pmap_body=_train_body(vary=False),
    program=_program, oracle=_oracle,
    in_specs=lambda axes: (make_spec(), make_spec(axes.entry), make_spec(axes.entry)),
    out_specs=lambda axes: (make_spec(), make_spec()),
    example_shapes=_shapes, arg_names=("params", "x", "y"), count_terms=_n_terms,
    dtype_kinds=frozenset({"float"}), validate=_check_dtypes, family="strategy",
    exact=False,  # Adam divides by a square root: rounds on any input
    exact_dtypes=WIDE_FLOATS,  # float16 is refused
    hlo=_hlo, source="optax_training.py"))
