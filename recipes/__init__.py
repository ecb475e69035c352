"""The recipe files, importable as ``collectives.recipes``.

Each file here runs alone (``python recipes/<file>.py``) and can be copied
into a project as it is: it imports only jax and numpy (and optax where it
trains). The library imports the same files, as the subpackage
``collectives.recipes``, and registers their bodies, global programs and
NumPy oracles with the facts of ``collectives/_facts/``: the code a user
copies is the code that ``python -m collectives check`` runs.
"""

import ast
import os


def index() -> list[tuple[str, str]]:
    """(file name, first line of its docstring) of every recipe file here."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name != "__init__.py":
            with open(os.path.join(here, name)) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            found.append((name, doc.splitlines()[0] if doc else ""))
    return found


if __name__ == "__main__":
    # python recipes/__init__.py: what each recipe file shows, one line each
    for name, summary in index():
        print(f"{name:<28} {summary}")
