"""``guides/dp_training.py``: data-parallel SGD keeps the parameters
identical on every device and equal to single-device training."""

import functools

import numpy as np
import pytest

import collectives as cx
from collectives.testing import assert_replicated
from collectives.testing import tolerance
from helpers import load_recipe


@functools.cache
def _training_module():
    return load_recipe("dp_training")


def test_data_parallel_sgd_keeps_params_identical_and_equal_to_one_device():
    train = _training_module()
    n, steps = 4, 20  # the recipe file's main() uses 8 devices and 50 steps
    mesh = cx.make_mesh((n,), "i")
    params, x, y = train.example(n)
    one = train.train_one_device(params, x, y, steps)
    want = train.train_numpy(params, x, y, steps)
    # The recipe's bound: one step's rounding bound (2 eps per term of a
    # gradient element) times the steps, since SGD here is a contraction.
    rtol = train.tolerance(*x.shape, n_steps=steps)
    assert rtol == pytest.approx(tolerance("float32", steps * (x.shape[0]
                                                              + x.shape[1] + 4))[0])
    results = {
        "pmap": train.train_pmap(params, x, y, n, steps),  # checks its copies
        "shard_map": train.train_shard_map(params, x, y, mesh, steps),
        "jit": train.train_jit(params, x, y, mesh, steps),
    }
    for form, (trained, losses) in results.items():
        for name in ("w", "b"):
            got = trained[name]
            if form != "pmap":
                assert_replicated(got, name=f"{form} {name}")  # bitwise, per device
            np.testing.assert_allclose(np.asarray(got), np.asarray(one[name]),
                                       rtol=rtol, atol=rtol, err_msg=form)
            np.testing.assert_allclose(np.asarray(got), want[name], rtol=rtol,
                                       atol=rtol, err_msg=form)
        assert losses[-1] < losses[0] / 10, form
