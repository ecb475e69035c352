"""The pipeline diagram's trace: the GPipe schedule recorded from a real run of
``recipes/pipeline.py``'s ``pipeline_value_and_grad``."""

import numpy as np
import pytest
from jax import lax

from collectives._strategy_diagrams import pipeline as diagram
from collectives.recipes import pipeline as file
from helpers import assert_draws_svg

S, M = 8, 4


@pytest.fixture(scope="module")
def record():
    return diagram.trace(S, M)


def gpipe(stages, microbatches):
    """The textbook GPipe forward schedule: stage s runs microbatch t - s."""
    t = np.arange(microbatches + stages - 1)[None, :] - np.arange(stages)[:, None]
    return np.where((t >= 0) & (t < microbatches), t, diagram.NONE)


def test_forward_is_the_gpipe_schedule(record):
    assert record.ticks == M + S - 1
    np.testing.assert_array_equal(record.forward, gpipe(S, M))


def test_backward_runs_the_schedule_in_reverse(record):
    # backward step k is the transpose of forward tick T - 1 - k
    np.testing.assert_array_equal(record.backward, gpipe(S, M)[:, ::-1])


def test_bubble_is_s_minus_1_ticks_per_stage_and_pass(record):
    np.testing.assert_array_equal(record.idle, S - 1)
    assert np.all(np.sum(record.backward < 0, axis=1) == S - 1)
    assert record.idle[0] / record.ticks == pytest.approx(file.bubble_fraction(S, M))
    assert "bubble 7 of 11 ticks" in diagram.text(record)


def test_bubble_ticks_compute_zeros_or_discarded_repeats(record):
    ticks = np.arange(record.ticks)
    for s in range(S):
        before, after = ticks < s, ticks >= M + s
        assert np.all(record.forward_input[s, before] == diagram.NONE)
        assert np.all(record.forward_input[s, after] == M - 1)  # the repeat
        assert not record.forward_used[s, before | after].any()


def test_the_traced_run_is_the_recipe(record):
    assert record.loss == pytest.approx(record.loss_oracle, rel=1e-5)


class _ReversedPpermute:
    """``lax`` with every ppermute sent the other way (a broken pipeline)."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def ppermute(x, axis_name, perm):
        return lax.ppermute(x, axis_name, [(dst, src) for src, dst in perm])


def test_a_reversed_ppermute_shows_in_the_trace(monkeypatch):
    monkeypatch.setattr(file, "lax", _ReversedPpermute())
    broken = diagram.trace(4, 4)
    assert not np.array_equal(broken.forward, gpipe(4, 4))
    # no stage after the first ever receives a microbatch's activation
    assert not (broken.forward_input[1:] >= 0).any()


def test_more_microbatches_shrink_the_bubble():
    record = diagram.trace(4, 8)
    np.testing.assert_array_equal(record.forward, gpipe(4, 8))
    np.testing.assert_array_equal(record.idle, 3)
    assert "bubble 3 of 11 ticks" in diagram.text(record)


def test_draw_writes_an_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
