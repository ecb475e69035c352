"""The MoE diagram's trace: dispatch and combine recorded from a real run of
``recipes/moe.py``'s ``route``, ``assign_slots`` and ``moe_body``."""

import numpy as np
import pytest

from collectives._strategy_diagrams import moe as diagram
from collectives.recipes import moe as file
from helpers import assert_draws_svg


@pytest.fixture(scope="module")
def record():
    return diagram.trace()


def test_the_case_is_small_and_drops_a_few(record):
    assert (record.n_devices, record.tokens_per_device, record.n_experts) == (4, 8, 4)
    assert record.capacity == 2  # ceil(1.0 * 8 tokens / 4 experts)
    assert 0 < record.dropped < 8


def test_dropped_tokens_equal_the_oracle(record):
    assert record.matches_oracle
    assert record.dropped == record.oracle_dropped
    assert record.dropped == int(np.sum(~record.kept))
    # a token comes back as zeros exactly when assign_slots gave it no slot
    np.testing.assert_array_equal(record.returned_token == diagram.DROPPED,
                                  ~record.kept)


def test_capacity_is_first_come_first_served_per_source_and_expert(record):
    for d in range(record.n_devices):
        for j in range(record.n_experts):
            mine = np.flatnonzero(record.expert[d] == j)  # local token order
            kept = min(len(mine), record.capacity)
            np.testing.assert_array_equal(record.slot[d, mine[:kept]],
                                          np.arange(kept))
            assert np.all(record.slot[d, mine[kept:]] == diagram.DROPPED)


def test_combine_brings_each_kept_token_home_from_its_expert(record):
    kept = record.kept
    np.testing.assert_array_equal(record.returned_token[kept], record.home[kept])
    np.testing.assert_array_equal(record.returned_expert[kept], record.expert[kept])


def test_buffers_hold_each_kept_token_once(record):
    buffers = record.buffers()
    assert buffers.shape == (record.n_experts, record.n_devices, record.capacity)
    assert np.sum(buffers >= 0) == np.sum(record.kept)
    assert "came back to its own row: True" in diagram.text(record)


def test_compiled_layer_has_the_dispatch_and_combine_all_to_alls(record):
    assert record.all_to_alls == 2
    n, e, c = record.n_devices, record.n_experts, record.capacity
    buffer = e * c * (3 + e) * 4  # [E, C, d] float32: d = 3 marker channels + E
    assert record.all_to_all_bytes == 2 * (n - 1) / n * buffer


def test_a_smaller_capacity_shows_in_the_trace(record, monkeypatch):
    # every place the file sizes its buffers (body and oracle) gets 1 slot
    monkeypatch.setattr(file, "expert_capacity", lambda *args, **kwargs: 1)
    smaller = diagram.trace()
    assert smaller.capacity == 1 < record.capacity
    assert smaller.dropped > record.dropped
    assert smaller.dropped == smaller.oracle_dropped and smaller.matches_oracle


def test_draw_writes_an_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
