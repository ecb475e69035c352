"""The committed matrix results (docs/compat/results/) are not stale.

They must cover every release of the supported range (tools/jax_releases.txt,
the one list of it) and every probe, and agree with the version boundaries
collectives._compat states; a measured row that fails must give its reason
and docs/compat/workarounds.json a workaround. A registered recipe a release
has no row for is not yet measured there: its test here is skipped, saying
so, until ``python tools/jax_matrix.py --missing`` measures it. Refresh whole
releases with ``python tools/jax_matrix.py`` (every release) or
``--releases V ...``.
"""

import jax
import pytest

import collectives as cx
from collectives import _compat
from helpers import load_matrix

REFRESH = "Fix: run `python tools/jax_matrix.py --releases {}` and commit the result."
MEASURE = ("Fix: run `python tools/jax_matrix.py --missing` (minutes a release) and "
           "commit docs/compat/results/.")


matrix = load_matrix()
RELEASES = matrix.read_releases()
RESULTS = matrix.load_results()
UNMEASURED = matrix.unmeasured(RESULTS, list(cx.RECIPES))
FAILING = {release: matrix.failing_rows(result, matrix.load_workarounds())
           for release, result in RESULTS.items()}


def test_the_range_starts_at_the_oldest_supported_jax():
    oldest = next(iter(RELEASES))
    assert _compat._parse_version(oldest) == _compat.OLDEST_SUPPORTED_JAX
    assert list(RELEASES) == sorted(RELEASES, key=matrix.version_key)


def test_the_installed_jax_is_inside_the_listed_range():
    newest = max(RELEASES, key=matrix.version_key)
    assert matrix.version_key(jax.__version__) <= matrix.version_key(newest), (
        f"JAX {jax.__version__} is newer than the newest release in "
        f"tools/jax_releases.txt ({newest}). Fix: add a line for it there, then "
        f"run `python tools/jax_matrix.py --releases {jax.__version__}`.")


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_release_has_an_installed_result(release):
    assert release in RESULTS, (f"no docs/compat/results/jax-{release}.json. "
                                + REFRESH.format(release))
    result = RESULTS[release]
    assert result["install"]["ok"], (
        f"jax {release} did not install: {result['install']['detail']}. Fix: "
        "change its Python in tools/jax_releases.txt, or drop it from the range")


def test_no_result_lies_outside_the_range():
    assert set(RESULTS) <= set(RELEASES), (
        f"results for releases not in tools/jax_releases.txt: "
        f"{sorted(set(RESULTS) - set(RELEASES))}. Fix: list them or delete them")


@pytest.mark.parametrize("release", list(RESULTS))
def test_results_answer_every_probe(release):
    probes = sorted(set(matrix.probe_docs()) - set(RESULTS[release].get("probes", {})))
    assert not probes, (f"jax {release}: no answer for probes {probes}. "
                        + REFRESH.format(release))


@pytest.mark.parametrize("name", list(cx.RECIPES))
def test_the_recipe_agrees_on_every_release(name):
    # Its measured rows first: a failure there fails even while other
    # releases have not measured it yet.
    failing = [f"jax {release}: {problems[name]}"
               for release, problems in FAILING.items() if name in problems]
    assert not failing, "; ".join(failing)
    if name in UNMEASURED:
        pytest.skip(f"not yet measured: {name} on jax "
                    f"{' '.join(UNMEASURED[name])}. {MEASURE}")


@pytest.mark.parametrize("probe", sorted(_compat.PROBE_BOUNDARIES))
def test_compat_boundaries_agree_with_the_matrix(probe):
    since, gone_in = _compat.PROBE_BOUNDARIES[probe]
    exceptions = _compat.PROBE_EXCEPTIONS.get(probe, frozenset())
    assert probe in matrix.probe_docs()
    for release, result in RESULTS.items():
        version = _compat._parse_version(release)
        expected = (since <= version and (gone_in is None or version < gone_in)
                    and version not in exceptions)
        got = result.get("probes", {}).get(probe)
        assert got == expected, (
            f"{probe} is {got} on jax {release}, but "
            f"collectives._compat.PROBE_BOUNDARIES says {expected}")

