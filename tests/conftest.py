"""Fixtures shared by the test files (the suite's configuration is the
repository's conftest.py)."""

import pytest

import collectives as cx


@pytest.fixture(scope="module")
def mesh():
    """A 1-D mesh over 8 devices, axis ``"i"``; a test file that needs
    another ``mesh`` defines its own."""
    return cx.make_mesh((8,), "i")
