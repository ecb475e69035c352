"""Diagrams of the parallelism strategies, each drawn from a real run of its
recipe file's functions: ``trace()`` runs them and records what happened,
``draw(record, path)`` writes the SVG the docs show, ``text(record)`` says the
same in a small table."""
