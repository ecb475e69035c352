"""Hypothesis profiles: ``ci`` (the default) and ``deep``."""

from __future__ import annotations

import os

PROFILE_ENV = "HYPOTHESIS_PROFILE"

PROFILES = {
    # Derandomised so CI is reproducible; no deadline because the first call
    # of every new shape compiles.
    "ci": dict(max_examples=12, derandomize=True),
    "deep": dict(max_examples=200),
    "dev": dict(max_examples=4, derandomize=True),
}


def register_profiles() -> str:
    """Register the profiles and load the one ``$HYPOTHESIS_PROFILE`` names.

    Returns:
      The name of the loaded profile (``ci`` unless the variable says otherwise).
    """
    from hypothesis import HealthCheck
    from hypothesis import settings

    for name, options in PROFILES.items():
        settings.register_profile(
            name, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            **options)
    chosen = os.environ.get(PROFILE_ENV, "ci")
    if chosen not in PROFILES:
        raise ValueError(
            f"${PROFILE_ENV}={chosen!r} is not a profile; choose one of "
            f"{sorted(PROFILES)}.")
    settings.load_profile(chosen)
    return chosen
