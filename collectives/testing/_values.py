"""Array values for property tests: every dtype JAX computes in, bounded, and
optionally exact (small integers whose sums round nowhere)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from collectives._arrays import dtype_kind

EXACT_RANGE = (-8, 8)
"""Values drawn with ``exact=True``: a sum of up to 32 of them stays below
256 in magnitude, which even bfloat16 (8 significant bits) holds exactly."""

DEFAULT_RANGE = (-100, 100)
"""Bounds on values drawn without ``exact``: large enough to round, small
enough that sums over a mesh stay far from float16's limit (65504)."""

_FLOAT_WIDTH = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}


def _jax_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as JAX will compute in it (float64 -> float32 without x64)."""
    try:
        return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))
    except TypeError:
        raise TypeError(f"arrays(dtype={dtype!r}): not a dtype. Fix: pass e.g. "
                        "'float32', 'int32', 'bfloat16' or jnp.float16.") from None


def _bounds(dtype: np.dtype, exact: bool, min_value: Any, max_value: Any
            ) -> tuple[Any, Any]:
    lo_default, hi_default = EXACT_RANGE if exact else DEFAULT_RANGE
    lo = lo_default if min_value is None else min_value
    hi = hi_default if max_value is None else max_value
    kind = dtype_kind(dtype)
    if kind == "int":
        lo, hi = math.ceil(lo), math.floor(hi)
        info = np.iinfo(dtype)
        if min_value is None:
            lo = max(lo, int(info.min))
        if max_value is None:
            hi = min(hi, int(info.max))
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"arrays(dtype={dtype.name}): bounds [{lo}, {hi}] leave the range of "
                f"{dtype.name} [{info.min}, {info.max}]. Fix: narrow min_value/"
                "max_value.")
    if exact and kind in ("float", "complex"):
        part = np.dtype(jnp.finfo(dtype).dtype)
        limit = 2 ** (jnp.finfo(part).nmant + 1)
        if int(lo) != lo or int(hi) != hi or max(abs(lo), abs(hi)) > limit:
            raise ValueError(
                f"arrays(dtype={dtype.name}, exact=True): bounds [{lo}, {hi}] must be "
                f"integers of magnitude <= {limit}, which {dtype.name} holds exactly. "
                "Fix: narrow min_value/max_value, or drop exact=True.")
        lo, hi = int(lo), int(hi)
    if lo > hi:
        raise ValueError(f"arrays: min_value={lo} is greater than max_value={hi}.")
    return lo, hi


def _inward(value: float, dtype: np.dtype, toward: float) -> float:
    """``value`` rounded to the NumPy float ``dtype``, moved one step toward
    ``toward`` if rounding left the interval (hypothesis needs bounds that the
    drawing width represents)."""
    rounded = np.asarray(value).astype(dtype)
    if (float(rounded) - value) * (toward - value) < 0:
        rounded = np.nextafter(rounded, np.asarray(toward).astype(dtype))
    return float(rounded)


def _real_values(shape: Any, dtype: np.dtype, exact: bool, lo: Any, hi: Any
                 ) -> st.SearchStrategy[np.ndarray]:
    """Every element drawn on its own (no fill value), so data movement bugs
    show: a block that lands on the wrong device rarely holds equal values."""
    kind = dtype_kind(dtype)
    if kind == "bool":
        return hnp.arrays(np.bool_, shape, elements=st.booleans(), fill=st.nothing())
    if kind == "int" or exact:
        return hnp.arrays(np.int64, shape, elements=st.integers(lo, hi),
                          fill=st.nothing()).map(lambda a: a.astype(dtype))
    width = _FLOAT_WIDTH[dtype.name]
    base = np.dtype(f"float{width}")
    elements = st.floats(_inward(lo, base, hi), _inward(hi, base, lo),
                         allow_nan=False, allow_infinity=False,
                         allow_subnormal=False, width=width)
    if base != dtype:  # bfloat16: round each element, keep it if still in bounds
        elements = elements.map(lambda v: float(np.asarray(v).astype(dtype))).filter(
            lambda v: lo <= v <= hi)
    return hnp.arrays(base, shape, elements=elements, fill=st.nothing()).map(
        lambda a: a.astype(dtype))


def arrays(shape: Any, dtype: Any = "float32", *, exact: bool = False,
           min_value: float | None = None, max_value: float | None = None
           ) -> st.SearchStrategy[np.ndarray]:
    """NumPy arrays of ``shape`` and ``dtype``, every element drawn on its own.

    Floats are finite and normal (no NaN, infinity or subnormals: XLA on CPU
    flushes subnormals to zero, NumPy does not), within
    :data:`DEFAULT_RANGE` unless bounded otherwise. ``exact=True`` draws small
    integers (:data:`EXACT_RANGE`) in any dtype: every float dtype holds them
    and their sums exactly, so results can be compared bit for bit.

    Args:
      shape: an int, a tuple of ints, or a strategy of shapes.
      dtype: ``float16``, ``bfloat16``, ``float32``, ``float64`` (needs
        ``jax_enable_x64``; otherwise float32, as JAX would compute), any
        int or uint, ``bool``, ``complex64``; or a strategy of dtypes.
      exact: draw small integers only.
      min_value, max_value: bounds on the values (on each part of a complex).

    Returns:
      A strategy of ``np.ndarray``.

    Raises:
      TypeError: ``dtype`` is not a dtype.
      ValueError: the bounds do not fit the dtype (with ``exact``: integers
        the dtype holds exactly).

    Examples:
      >>> import numpy as np
      >>> from hypothesis import given
      >>> from collectives.testing.strategies import arrays
      >>> @given(arrays((8, 3), "bfloat16", exact=True))
      ... def check(x):
      ...     assert x.dtype.name == "bfloat16" and np.all(np.abs(x) <= 8)
      >>> check()
    """
    static = not isinstance(dtype, st.SearchStrategy)
    if static:
        checked = _jax_dtype(dtype)
        _bounds(checked, exact, min_value, max_value)

    @st.composite
    def draw_array(draw: st.DrawFn) -> np.ndarray:
        dt = _jax_dtype(draw(dtype) if not static else dtype)
        shp = draw(shape) if isinstance(shape, st.SearchStrategy) else shape
        lo, hi = _bounds(dt, exact, min_value, max_value)
        if dtype_kind(dt) == "complex":
            part = np.dtype(jnp.finfo(dt).dtype)
            real = draw(_real_values(shp, part, exact, lo, hi))
            imag = draw(_real_values(shp, part, exact, lo, hi))
            return (real + 1j * imag).astype(dt)
        if dtype_kind(dt) not in ("bool", "int", "float"):
            raise TypeError(f"arrays(dtype={dt.name}): unsupported dtype.")
        return draw(_real_values(shp, dt, exact, lo, hi))

    return draw_array()


def exact_values(draw: st.DrawFn, shape: tuple[int, ...], dtype: Any
                 ) -> np.ndarray:
    """Draw small integers in ``[-8, 8]`` as ``dtype``: exact in every float dtype.

    For use inside ``@composite`` functions: ``x = exact_values(draw, shape, dtype)``
    is ``draw(arrays(shape, dtype, exact=True))``.
    """
    return draw(arrays(shape, dtype, exact=True))
