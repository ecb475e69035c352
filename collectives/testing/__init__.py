"""Test your own sharded code: assertions and the tolerance policy.

``collectives.testing.strategies`` (hypothesis) and the pytest plugin live in
submodules so that importing this module needs only jax and numpy.
"""

from collectives.testing._assertions import Agreement
from collectives.testing._assertions import assert_forms_agree
from collectives.testing._assertions import compare_arrays
from collectives.testing._tolerance import tolerance

__all__ = [
    "Agreement",
    "assert_forms_agree",
    "compare_arrays",
    "tolerance",
]
