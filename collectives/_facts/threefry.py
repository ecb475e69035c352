"""JAX's default random stream (threefry2x32) reproduced in NumPy, bit for bit.

The cipher and ``fold_in`` are ``recipes/monte_carlo.py``'s, where the
``metropolis`` oracle uses them to recompute on the host exactly the random
bits the pmap, shard_map and jit forms draw; this module only names them for
the library.
"""

from __future__ import annotations

from collectives.recipes.monte_carlo import fold_in_numpy as fold_in
from collectives.recipes.monte_carlo import threefry2x32

__all__ = ["fold_in", "threefry2x32"]
