"""The data-parallel Adam diagram: traced from a real run of
recipes/optax_training.py."""

import numpy as np
import pytest
from jax import lax

pytest.importorskip("optax")

from collectives._strategy_diagrams import optax_training as diagram
from collectives.recipes import optax_training as opt_file
from helpers import assert_draws_svg

N, ROWS = 8, 4


@pytest.fixture(scope="module")
def record():
    return diagram.trace(N, ROWS)


def _step_one(n, rows):
    """Each device's loss and gradient at zero params, and the whole batch's,
    in the record's element order (b, then w)."""
    _, x, y = diagram.data(n, rows)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)

    def loss_grad(xs, ys):
        residual = -ys  # w = 0, b = 0
        scale = 2.0 / residual.size
        grad = np.concatenate([scale * residual.sum(0),
                               (scale * xs.T @ residual).ravel()])
        return np.mean(residual ** 2), grad

    local = [loss_grad(x64[d * rows:(d + 1) * rows], y64[d * rows:(d + 1) * rows])
             for d in range(n)]
    return local, loss_grad(x64, y64)


def test_each_device_brings_its_own_gradient(record):
    local, whole = _step_one(N, ROWS)
    assert record.elements[:3] == ("b[0]", "b[1]", "w[0,0]")
    assert len(record.elements) == 2 + 4 * 2
    for d, (loss, grad) in enumerate(local):
        assert record.local_loss[0, d] == pytest.approx(loss, rel=1e-5)
        np.testing.assert_allclose(record.local_grad[0, d], grad, rtol=1e-5, atol=1e-6)
    # the devices' gradients differ; their average is the whole batch's
    assert np.ptp(record.local_grad[0], axis=0).min() > 1e-3
    np.testing.assert_allclose(record.mean_grad[0, 0], whole[1], rtol=1e-5, atol=1e-6)
    assert record.mean_loss[0, 0] == pytest.approx(whole[0], rel=1e-5)


def test_pmean_gives_every_device_the_same_average_every_step(record):
    assert record.local_grad.shape == (diagram.N_STEPS, N, 10)
    np.testing.assert_allclose(record.mean_grad,
                               np.broadcast_to(record.local_grad.mean(1, keepdims=True),
                                               record.mean_grad.shape),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(record.mean_loss, np.broadcast_to(
        record.local_loss.mean(1, keepdims=True), record.mean_loss.shape), rtol=1e-6)
    assert (record.mean_grad == record.mean_grad[:, :1]).all()  # bit for bit
    assert (record.mean_loss == record.mean_loss[:, :1]).all()
    np.testing.assert_array_equal(record.losses, record.mean_loss[:, 0])


def test_losses_equal_one_device_and_numpy(record):
    tol = record.tolerance
    np.testing.assert_allclose(record.losses, record.losses_one_device, rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(record.losses, record.losses_numpy, rtol=tol, atol=tol)
    assert record.param_gap < tol
    assert record.losses[-1] < 0.2 * record.losses[0]


def test_the_n_x_gradient_trap_shows_up():
    n = 4
    trapped = diagram.trace(n, ROWS, n_steps=3, vary=False)
    local, whole = _step_one(n, ROWS)
    # jax.grad at invariant params already summed: every device brings n x
    # the whole batch's gradient, and pmean keeps it
    for d in range(n):
        np.testing.assert_allclose(trapped.local_grad[0, d], n * whole[1], rtol=1e-5,
                                   atol=1e-5)
    np.testing.assert_allclose(trapped.mean_grad[0, 0], n * whole[1], rtol=1e-5,
                               atol=1e-5)
    # the losses are each device's own, averaged as they should be
    np.testing.assert_allclose(trapped.local_loss[0], [loss for loss, _ in local],
                               rtol=1e-5)


class _Summed:
    """The file's ``lax`` with ``pmean`` summing instead of averaging."""

    def __getattr__(self, name):
        return getattr(lax, name)

    @staticmethod
    def pmean(x, axis_name):
        return lax.psum(x, axis_name)


def test_a_mutated_pmean_shows_up(monkeypatch):
    n = 4
    monkeypatch.setattr(opt_file, "lax", _Summed())
    mutated = diagram.trace(n, ROWS, n_steps=3)
    assert opt_file.lax.__class__ is _Summed  # the tap was taken off again
    np.testing.assert_allclose(mutated.mean_grad[0, 0], mutated.local_grad[0].sum(0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mutated.losses[0], n * mutated.losses_one_device[0],
                               rtol=1e-5)


def test_text_table(record):
    table = diagram.text(record)
    rows = table.splitlines()
    assert "lax.pmean at step 1" in rows[0]
    outs = {row.split("|")[2] for row in rows[3:3 + N]}
    assert len(outs) == 1  # the same average on every device
    assert len({row.split("|")[1] for row in rows[3:3 + N]}) == N


def test_draw_writes_svg(record, tmp_path):
    assert_draws_svg(diagram, record, tmp_path, widths=("wide", "narrow"))
