"""The all-to-all attention diagram: traced from a real run of
recipes/all_to_all_attention.py."""

import numpy as np
import pytest
from jax import lax

from collectives._strategy_diagrams import all_to_all_attention as diagram
from collectives.recipes import all_to_all_attention as a2a_file
from helpers import assert_draws_svg

N, ROWS = 8, 2


@pytest.fixture(scope="module")
def record():
    return diagram.trace(N, ROWS)


def _layouts(record):
    t, h = np.meshgrid(np.arange(record.seq), np.arange(record.heads), indexing="ij")
    return t // ROWS, h // (record.heads // record.n_devices)


def test_sequence_blocks_go_to_head_blocks_and_back(record):
    by_seq, by_head = _layouts(record)
    before, between, after = diagram.panels(record)
    np.testing.assert_array_equal(before, by_seq)
    np.testing.assert_array_equal(between, by_head)
    np.testing.assert_array_equal(after, by_seq)
    # q, k and v move alike; attention's output stays where it was computed
    for call in range(3):
        np.testing.assert_array_equal(record.held_in[call], by_seq)
        np.testing.assert_array_equal(record.held_out[call], by_head)
    np.testing.assert_array_equal(record.held_in[3], by_head)
    assert record.matches_oracle


def test_the_calls_the_body_made(record):
    assert record.calls == ("q", "k", "v", "output")
    assert record.split_axis == (1, 1, 1, 0)  # heads, then the sequence
    assert record.concat_axis == (0, 0, 0, 1)
    d = record.seq + 2
    assert record.block_in == ((ROWS, N, d),) * 3 + ((record.seq, 1, d),)
    assert record.block_out == ((record.seq, 1, d),) * 3 + ((ROWS, N, d),)


def test_compiled_body_has_four_all_to_alls(record):
    assert record.all_to_alls == 4
    block = ROWS * N * (record.seq + 2) * 4  # float32 block per device
    assert record.all_to_all_bytes == 4 * (N - 1) / N * block


def test_text_table(record):
    table = diagram.text(record)
    rows = table.splitlines()
    assert rows[1].split("|")[1].split() == ["before"]
    first = [cell.split() for cell in rows[3].split("|")[1:]]
    assert first == [["0"] * N, [str(d) for d in range(N)], ["0"] * N]
    assert "4 all-to-alls" in table and "equals attention_numpy" in table


class _Shifted:
    """The file's ``lax`` with the heads all-to-all handing each device its
    neighbour's head block."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def all_to_all(x, axis_name, split_axis, concat_axis, **kwargs):
        out = lax.all_to_all(x, axis_name, split_axis, concat_axis, **kwargs)
        if split_axis != 1:
            return out
        n = lax.axis_size(axis_name)
        return lax.ppermute(out, axis_name, [(d, (d + 1) % n) for d in range(n)])


def test_a_mutated_all_to_all_shows_up(monkeypatch):
    n = 4
    monkeypatch.setattr(a2a_file, "lax", _Shifted())
    mutated = diagram.trace(n, ROWS)
    assert a2a_file.lax.__class__ is _Shifted  # the tap was taken off again
    _, between, _ = diagram.panels(mutated)
    heads = np.arange(mutated.heads)[None, :].repeat(mutated.seq, 0)
    np.testing.assert_array_equal(between, (heads + 1) % n)
    assert not mutated.matches_oracle


def test_draw_writes_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
