"""The guides, importable as ``collectives.guides``: the sharp edges, the
migrations from ``pmap`` and removed APIs, distributed arrays, a training
loop, and JAX's multi-process runtime.

Each file here runs alone (``python guides/<file>.py``), imports only jax
and numpy (and optax where it trains), shows what fails or surprises and its
fix, or an old form beside its replacement, and prints an ``ok:`` line when
what it shows holds on the JAX that runs it. Unlike the files in
``recipes/``, no recipe of the registry lives here: ``python -m collectives
check`` does not run them; their own tests (``tests/test_<file>.py``) and
the documentation's build do.
"""
