"""The tolerance policy, in one place.

* Integers and booleans compare exactly.
* Pure data movement (gathers, permutes, all-to-all: ``n_terms == 0``)
  compares exactly in every dtype: no arithmetic, no rounding.
* Floats otherwise allow ``2 * eps(dtype) * n_terms`` relative error: the
  classic worst-case bound for summing ``n_terms`` values (each addition
  rounds once), doubled because the oracle rounds its wide result once more.
  The same figure is the absolute tolerance per unit of input magnitude, for
  sums that cancel to near zero.

Anything looser is written at the call site, with the reason beside it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from collectives._arrays import as_dtype


def tolerance(dtype: Any, n_terms: int = 1) -> tuple[float, float]:
    """``(rtol, atol)`` for a result of ``dtype`` built from ``n_terms`` roundings.

    ``atol`` is per unit of input magnitude: scale it by the largest absolute
    input value (``assert_forms_agree`` does).

    Args:
      dtype: the result's dtype.
      n_terms: how many rounded operations feed each element (e.g. the number
        of devices a psum adds up); 0 for pure data movement.

    Returns:
      ``(rtol, atol)``; ``(0.0, 0.0)`` means exact.

    Raises:
      ValueError: ``n_terms`` is negative.
      TypeError: ``dtype`` is not a dtype, or ``n_terms`` not an int.

    Examples:
      >>> from collectives.testing import tolerance
      >>> tolerance("int32", 8)
      (0.0, 0.0)
      >>> tolerance("float32", 0)
      (0.0, 0.0)
      >>> rtol, atol = tolerance("float32", 8)
      >>> rtol == 2 * 8 * 2.0 ** -23
      True
      >>> tolerance("bfloat16", 4)[0]
      0.0625
    """
    if isinstance(n_terms, bool) or not isinstance(n_terms, (int, np.integer)):
        raise TypeError(f"n_terms: expected an int, got {n_terms!r}.")
    if n_terms < 0:
        raise ValueError(
            f"n_terms: expected a count of rounded operations (>= 0), got {n_terms}.")
    dtype = as_dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact) or n_terms == 0:
        return 0.0, 0.0
    eps = float(jnp.finfo(dtype).eps)
    rtol = 2.0 * eps * int(n_terms)
    return rtol, rtol


def can_fail(dtype: Any, n_terms: int) -> bool:
    """Whether a comparison under the policy can fail at all.

    With ``rtol >= 1`` (bfloat16's eps is ``2 ** -7``, so 64 rounded
    operations reach it) a result of zeros passes every element: ``check``
    skips such rows and the strategies draw no such case.

    Examples:
      >>> from collectives.testing import can_fail
      >>> can_fail("bfloat16", 16), can_fail("bfloat16", 64), can_fail("float32", 64)
      (True, False, True)
    """
    return tolerance(dtype, n_terms)[0] < 1


def describe_tolerance(dtype: Any, rtol: float, atol: float) -> str:
    """A short phrase for messages: ``exact (int32)`` or the two numbers."""
    if rtol == 0 and atol == 0:
        return f"exact ({np.dtype(dtype).name})"
    return f"rtol={rtol:.3g}, atol={atol:.3g} ({np.dtype(dtype).name})"


def check_tolerances(caller: str, **given: Any) -> None:
    """Refuse a tolerance (``rtol=``, ``atol=``) that is not a finite number
    >= 0, or an array of them; ``None`` is the default.

    Raises:
      ValueError: naming the caller, the argument, the value and the fix.
    """
    for name, value in given.items():
        if value is None:
            continue
        try:
            values = None if isinstance(value, (bool, str)) else np.asarray(
                value, dtype=np.float64)
        except (TypeError, ValueError):
            values = None
        if values is None or not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError(
                f"{caller}({name}={value!r}): expected a finite number >= 0 (0 "
                f"compares exactly). Fix: pass e.g. {name}=1e-5, or leave it out "
                "for the default.")
