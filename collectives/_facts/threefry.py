"""JAX's default random stream (threefry2x32) reproduced in NumPy, bit for bit.

The Monte Carlo oracles use it to recompute on the host exactly the random
bits the pmap, shard_map and jit forms draw, so a sampler's samples are
checked against an independent implementation, not only against each other.

What JAX computes (``jax/_src/random/threefry2x32.py``), for a key ``(k0, k1)``:

* ``fold_in(key, d)`` is ``threefry2x32(key, (0, d))``;
* ``split(key, n)[i]`` is ``threefry2x32(key, (0, i))`` under
  ``jax_threefry_partitionable`` (the default since JAX 0.5), so it equals
  ``fold_in(key, i)``; without it, the counters are ``iota(2 n)`` cut in halves;
* ``bits(key, shape)`` (32 bits) is ``y0 ^ y1`` of ``threefry2x32(key, (0, c))``
  with ``c`` the flat index of each element (``hi, lo`` words of a 64-bit
  counter); without ``jax_threefry_partitionable`` it is the hash of the
  counters ``iota(size)`` cut in halves and concatenated again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key: np.ndarray, x0: np.ndarray, x1: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 block cipher (20 rounds), elementwise over ``x0, x1``.

    Args:
      key: uint32 key data of shape ``[..., 2]``; broadcasts against ``x0``.
      x0, x1: uint32 counter words.

    Returns:
      The two uint32 output words, each with the broadcast shape.
    """
    key = np.asarray(key, np.uint32)
    k0 = key[..., 0]
    k1 = key[..., 1]
    x0, x1, k0, k1 = np.broadcast_arrays(
        np.atleast_1d(np.asarray(x0, np.uint32)),
        np.atleast_1d(np.asarray(x1, np.uint32)),
        np.atleast_1d(k0), np.atleast_1d(k1))
    schedule = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = x0 + schedule[0]
    x1 = x1 + schedule[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotate_left(x1, r) ^ x0
        x0 = x0 + schedule[(block + 1) % 3]
        x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def fold_in(key: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``jax.random.fold_in`` on raw key data, vectorised.

    ``key[..., 2]`` broadcasts against ``data`` (ints below 2**32); the result
    holds one key ``[..., 2]`` per broadcast element.
    """
    data = np.asarray(data).astype(np.uint32)
    key = np.asarray(key, np.uint32)
    y0, y1 = threefry2x32(key, np.zeros_like(data), data)
    shape = np.broadcast_shapes(data.shape, key.shape[:-1])
    return np.stack([y0.reshape(shape), y1.reshape(shape)], axis=-1)


def split(key: np.ndarray, n: int, *, partitionable: bool = True) -> np.ndarray:
    """``jax.random.split(key, n)`` on raw key data: ``[n, 2]``."""
    key = np.asarray(key, np.uint32)
    if partitionable:
        return fold_in(key, np.arange(n, dtype=np.uint32))
    counts = np.arange(2 * n, dtype=np.uint32)
    y0, y1 = threefry2x32(key, counts[:n], counts[n:])
    return np.concatenate([y0, y1]).reshape(n, 2)


def random_bits(key: np.ndarray, shape: Sequence[int], *,
                partitionable: bool = True) -> np.ndarray:
    """``jax.random.bits(key, shape, uint32)`` for one key (raw data ``[2]``)."""
    key = np.asarray(key, np.uint32)
    size = int(np.prod(shape, dtype=np.int64))
    if partitionable:
        counts = np.arange(size, dtype=np.uint64)
        hi = (counts >> np.uint64(32)).astype(np.uint32)
        lo = counts.astype(np.uint32)
        y0, y1 = threefry2x32(key, hi, lo)
        return (y0 ^ y1).reshape(tuple(shape))
    counts = np.arange(size + size % 2, dtype=np.uint32)
    counts[size:] = 0  # an odd count is padded with one zero
    half = counts.shape[0] // 2
    y0, y1 = threefry2x32(key, counts[:half], counts[half:])
    return np.concatenate([y0, y1])[:size].reshape(tuple(shape))


def uniform(key: np.ndarray, shape: Sequence[int], *,
            partitionable: bool = True) -> np.ndarray:
    """``jax.random.uniform(key, shape)`` (float32 in ``[0, 1)``) for one key."""
    bits = random_bits(key, shape, partitionable=partitionable)
    one = np.uint32(np.float32(1.0).view(np.uint32))
    return ((bits >> np.uint32(9)) | one).view(np.float32) - np.float32(1.0)
