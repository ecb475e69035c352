"""matplotlib for the commands' ``--plot``: an optional dependency."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend.

    Raises:
      RuntimeError: matplotlib is not installed; the message says how to
        install it.
    """
    try:  # optional: the bench extra
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib, which is not installed. Fix: pip install "
            "matplotlib (jax-collectives' 'bench' extra; in a checkout: pip "
            "install '.[bench]').") from None
    return plt
