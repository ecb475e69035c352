"""The ring attention diagram: traced from a real run of recipes/ring_attention.py."""

import numpy as np
import pytest
from jax import lax

from collectives._strategy_diagrams import ring_attention as diagram
from collectives.recipes import ring_attention as ring_file
from helpers import assert_draws_svg

N = 8


@pytest.fixture(scope="module")
def record():
    return diagram.trace(N)


def test_each_device_folds_every_block_once_in_ring_order(record):
    steps, devices = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
    for variant in range(2):
        held = record.k_block[variant]
        np.testing.assert_array_equal(record.v_block[variant], held)
        # step 0 the own block, then the block of device d - s
        np.testing.assert_array_equal(held, (devices - steps) % N)
        for device in range(N):
            assert sorted(held[:, device]) == list(range(N))


def test_query_block_stays_put(record):
    assert record.query_block == tuple(range(N))


def test_causal_masks_later_blocks_and_the_diagonal_in_part(record):
    plain, causal = diagram.folds(record, 0), diagram.folds(record, 1)
    assert (plain == diagram.FULL).all()
    np.testing.assert_array_equal(record.visible[0], np.ones((N, N)))
    blocks = record.k_block[1]
    devices = np.arange(N)[None, :]
    np.testing.assert_array_equal(causal[0], diagram.PARTIAL)
    np.testing.assert_array_equal(causal == diagram.SKIPPED, blocks > devices)
    assert (causal == diagram.SKIPPED).sum() == N * (N - 1) // 2
    # the diagonal block: query p sees keys up to p, (rows + 1) / (2 rows) of them
    rows = record.rows
    assert np.diag(record.visible[1]) == pytest.approx((rows + 1) / (2 * rows))
    # the run's attention pattern is the oracle's mask, block by block
    mask = np.tri(N * rows).reshape(N, rows, N, rows).mean(axis=(1, 3))
    np.testing.assert_allclose(record.visible[1], mask)


def test_compiled_body_permutes_k_and_v_each_step(record):
    assert record.permutes == 2 * (N - 1)
    block = record.rows * 1 * (N * record.rows) * 4  # [s, 1, S] float32 markers
    assert record.permute_bytes == 2 * (N - 1) * block


def test_text_table(record):
    table = diagram.text(record)
    assert "device  query |" in table
    rows = table.splitlines()
    cells = [row.split("|")[1].split() for row in rows[2:2 + N]]
    assert cells[0] == ["0~"] + [f"{b}x" for b in range(N - 1, 0, -1)]
    assert cells[-1] == ["7~"] + [str(b) for b in range(N - 2, -1, -1)]
    assert "14 collective-permutes" in table


class _Reversed:
    """The file's ``lax`` with ppermute sending the other way round the ring."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def ppermute(x, axis_name, perm):
        return lax.ppermute(x, axis_name, [(dst, src) for src, dst in perm])


def test_a_mutated_ring_shows_up(monkeypatch):
    n = 4
    monkeypatch.setattr(ring_file, "lax", _Reversed())
    mutated = diagram.trace(n)
    steps, devices = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    # blocks now come from d + s, while the causal mask still assumes d - s:
    # the run attends to the wrong keys
    np.testing.assert_array_equal(mutated.k_block[0], (devices + steps) % n)
    mask = np.tri(n * mutated.rows).reshape(n, mutated.rows, n, mutated.rows)
    assert not np.allclose(mutated.visible[1], mask.mean(axis=(1, 3)))


def test_draw_writes_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
