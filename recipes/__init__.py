"""The recipe files, importable as ``collectives.recipes``.

Each file here runs alone (``python recipes/<file>.py``) and can be copied
into a project as it is: it imports only jax and numpy (and optax where it
trains). The library imports the same files, as the subpackage
``collectives.recipes``, and registers their bodies, global programs and
NumPy oracles with the facts of ``collectives/_facts/``: the code a user
copies is the code that ``python -m collectives check`` runs.
"""
