"""Test your own sharded code: assertions, the tolerance policy, profiles.

* :func:`assert_forms_agree` runs several forms of one computation (a
  :class:`~collectives.Recipe`, or your own pmap / shard_map / jit callables
  and a NumPy reference) and reports which form disagrees, where, by how much
  and under which tolerance.
* :func:`assert_replicated` and :func:`assert_sharded_as` check where a
  ``jax.Array`` lives, reading every device's buffer.
* :func:`check_kernel` runs a Pallas kernel in TPU interpret mode in both
  DMA modes, with race detection and NaN for unwritten memory, bounded in
  time, and fails naming every race, NaN, wrong value, exception or hang.
* :func:`tolerance` is the one tolerance policy; :func:`can_fail` says
  whether a comparison under it can fail at all.
* ``collectives.testing.strategies`` has hypothesis strategies that draw
  only valid meshes, specs, shapes and arrays (needs ``hypothesis``).
* ``collectives.testing.plugin`` is the pytest plugin (``--cpu-devices``,
  ``mesh_1d``/``mesh_2d`` fixtures, ``@pytest.mark.devices(n)``), loaded
  automatically through its entry point.

Importing this module needs only jax and numpy.
"""

from collectives._compare import Agreement
from collectives._compare import assert_forms_agree
from collectives._compare import compare_arrays
from collectives._tolerance import can_fail
from collectives._tolerance import tolerance
from collectives.testing._kernel_check import DMA_MODES
from collectives.testing._kernel_check import KernelBugError
from collectives.testing._kernel_check import KernelRun
from collectives.testing._kernel_check import check_kernel
from collectives.testing._placement import assert_replicated
from collectives.testing._placement import assert_sharded_as
from collectives.testing._profiles import register_profiles

__all__ = [
    "DMA_MODES",
    "Agreement",
    "KernelBugError",
    "KernelRun",
    "assert_forms_agree",
    "assert_replicated",
    "assert_sharded_as",
    "can_fail",
    "check_kernel",
    "compare_arrays",
    "register_profiles",
    "tolerance",
]
