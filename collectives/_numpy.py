"""NumPy helpers the oracles share: wide accumulation and block views."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from collectives._arrays import dtype_kind

_WIDE = {"float": np.float64, "int": np.int64, "complex": np.complex128,
         "bool": np.bool_}


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` in the widest dtype of its kind, so the oracle rounds only once."""
    return x.astype(_WIDE[dtype_kind(x.dtype)])


def blocks(x: Any, n: int) -> Any:
    """View dim 0 of a global array as ``(n, block, ...)``: one row per shard.

    Works on NumPy and JAX arrays alike.
    """
    return x.reshape(n, x.shape[0] // n, *x.shape[1:])


def mean_dtype(dtype: Any) -> np.dtype:
    """What a mean over a dtype returns in JAX: floats keep theirs, ints get
    the default float (float32, or float64 with x64 on)."""
    if dtype_kind(dtype) in ("float", "complex"):
        return np.dtype(dtype)
    return np.dtype(jax.dtypes.canonicalize_dtype(np.float64))
