"""Hypothesis profiles: ``ci`` (bounded, derandomised), ``deep`` and ``dev``.

* ``ci``: 12 examples, derandomised, so every run draws the same cases and a
  failure reproduces. This replaces hypothesis's own ``ci`` profile.
* ``deep``: 200 random examples, for nightly or pre-release runs.
* ``dev``: 4 derandomised examples, for a quick loop while editing.

All three have no deadline (the first call of every new shape compiles) and
print the reproduction blob. ``$HYPOTHESIS_PROFILE`` picks one per run.
"""

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


def register_profiles(default: str | None = "ci") -> str | None:
    """Register the profiles and load the one ``$HYPOTHESIS_PROFILE`` names.

    Needs ``hypothesis``. The pytest plugin calls this when the ini setting
    ``hypothesis_profile`` is set; call it yourself from a ``conftest.py``
    otherwise.

    Args:
      default: the profile to load when ``$HYPOTHESIS_PROFILE`` is unset;
        ``None`` registers the profiles and loads nothing (unless the
        variable is set).

    Returns:
      The name of the loaded profile, or ``None`` if none was loaded.

    Raises:
      ValueError: the profile to load is not registered (neither one of
        ``ci``, ``deep``, ``dev`` nor one registered before).

    Examples:
      >>> from hypothesis import settings
      >>> from collectives.testing import register_profiles
      >>> before = settings.get_current_profile_name()
      >>> register_profiles(default=None) in (None, before)
      True
      >>> settings.get_profile("deep").max_examples
      200
    """
    # optional: the test extra (importing collectives.testing needs no hypothesis)
    from hypothesis import HealthCheck
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    for name, options in PROFILES.items():
        settings.register_profile(
            name, deadline=None, print_blob=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            **options)
    chosen = os.environ.get(PROFILE_ENV) or default
    if chosen is None:
        return None
    try:
        settings.get_profile(chosen)  # load_profile would switch before checking
    except InvalidArgument:
        source = f"${PROFILE_ENV}" if os.environ.get(PROFILE_ENV) else "the default"
        raise ValueError(
            f"{source} names hypothesis profile {chosen!r}, which is not registered. "
            f"Fix: choose one of {sorted(PROFILES)}, or register {chosen!r} first."
        ) from None
    settings.load_profile(chosen)
    return chosen
