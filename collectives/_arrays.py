"""Dtype kinds, host arrays and the checks the forms run on every argument."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

KINDS = frozenset({"float", "int", "bool", "complex"})

Shape = tuple[int, ...]


def as_dtype(dtype: Any) -> np.dtype:
    """``np.dtype(dtype)``, or a TypeError that names the value and the fix
    (NumPy's own says only "data type not understood")."""
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"dtype {dtype!r}: not a NumPy or JAX dtype. Fix: pass a dtype or its "
            "name, such as float32, bfloat16, int32 or bool.") from None


def narrowed(dtype: Any) -> str | None:
    """The dtype JAX computes in instead of ``dtype`` here: a 64-bit type's
    32-bit twin while ``jax_enable_x64`` is off (JAX narrows silently or with
    a warning, and a row would be labelled with a type it never ran);
    ``None`` where JAX keeps ``dtype``."""
    wanted = as_dtype(dtype)
    kept = np.dtype(jax.dtypes.canonicalize_dtype(wanted))
    return None if kept == wanted else kept.name


def dtype_kind(dtype: Any) -> str:
    """``"float"``, ``"int"``, ``"bool"`` or ``"complex"`` for a dtype."""
    dtype = as_dtype(dtype)
    if jnp.issubdtype(dtype, jnp.bool_):
        return "bool"
    if jnp.issubdtype(dtype, jnp.integer):
        return "int"
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return "complex"
    if jnp.issubdtype(dtype, jnp.floating):
        return "float"
    return dtype.name


def is_shape(x: Any) -> bool:
    """Whether ``x`` is a shape (a tuple of ints), the leaf of a shape tree."""
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def canonical(x: Any) -> np.ndarray:
    """``x`` on the host with the dtype JAX would give it (x64 off: 32 bits)."""
    arr = np.asarray(x)
    return arr.astype(jax.dtypes.canonicalize_dtype(arr.dtype), copy=False)


def brief(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def check_dims(dims: Any) -> tuple[int, ...]:
    """``example_args(dims=...)``: small positive ints."""
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(f"dims: expected a sequence of positive ints, got "
                        f"{dims!r}. Fix: pass e.g. dims=(2, 3).") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ValueError(
                f"dims: every entry must be a positive int, got {d!r} in "
                f"{dims!r}. Fix: pass e.g. dims=(2, 3); empty arrays are not "
                "supported.")
    return tuple(int(d) for d in dims)


def check_fits_canonical(leaf: Any, dtype: np.dtype, what: str) -> None:
    """64-bit integers JAX would silently wrap to 32 bits (x64 off) are an error."""
    target = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if (dtype_kind(dtype) != "int" or target.itemsize >= dtype.itemsize
            or not isinstance(leaf, (np.ndarray, np.generic)) or leaf.size == 0):
        return
    info = np.iinfo(target)
    low, high = leaf.min(), leaf.max()
    if low < info.min or high > info.max:
        raise ValueError(
            f"{what} has dtype {dtype} with values in [{low}, {high}], outside "
            f"{target.name}'s range: JAX (with jax_enable_x64 off) would convert "
            f"it to {target.name} and wrap those values. Fix: enable 64-bit "
            "types (jax.config.update('jax_enable_x64', True)) before creating "
            "arrays, or scale the values into range.")


def random_array(rng: np.random.Generator, shape: Shape, dtype: Any,
                 *, exact: bool = False) -> np.ndarray:
    """A NumPy array of ``shape`` and ``dtype`` for examples and checks.

    With ``exact=True`` floats are small integers, which every float dtype
    holds exactly and whose short sums stay exact, so results are comparable
    bit for bit.
    """
    dtype = np.dtype(jax.dtypes.canonicalize_dtype(as_dtype(dtype)))
    kind = dtype_kind(dtype)
    if kind == "bool":
        return rng.integers(0, 2, size=shape).astype(dtype)
    if kind == "int" or exact:
        values = rng.integers(-8, 9, size=shape)
        if kind == "complex":
            values = values + 1j * rng.integers(-8, 9, size=shape)
        return values.astype(dtype)
    values = rng.standard_normal(size=shape)
    if kind == "complex":
        values = values + 1j * rng.standard_normal(size=shape)
    return values.astype(dtype)


def bitwise_differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise: whether ``a`` and ``b`` (same shape and dtype) differ in any
    bit. Unlike ``!=``, NaN equals the same NaN and -0.0 differs from 0.0."""
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(np.broadcast_to(b, a.shape))
    itemsize = a.dtype.itemsize
    return (a.view(np.uint8).reshape(*a.shape, itemsize)
            != b.view(np.uint8).reshape(*a.shape, itemsize)).any(-1)
