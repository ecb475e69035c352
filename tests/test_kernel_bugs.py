"""Bugs planted in the kernel recipes, one at a time, and what catches each.

Each case edits one line of a kernel's recipe file (the text must be there:
a case that no longer applies fails), loads the edited file as a module of
its own, and runs its kernel under :func:`collectives.testing.check_kernel`
against the ``lax`` collective's result. Every case must be caught, and by
what the table says (a race, NaN, a wrong value, an exception, a hang). The
bugs no check here catches are listed in ``NOT_CAUGHT`` with why; the docs
page "Collectives from the inside" shows the same table.
"""

import importlib.util
import sys

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import collectives as cx
from collectives import _compat
from collectives.testing import KernelBugError
from collectives.testing import check_kernel
from helpers import RECIPE_FILES

pytestmark = pytest.mark.skipif(
    not _compat.HAS_INTERPRET_KERNELS,
    reason=f"the kernels need JAX 0.10.2 or newer (this is {jax.__version__})")

FILES = {path.name: path for path in RECIPE_FILES}

# (file, planted bug, text replaced, replacement, what must be reported: any
# of these words; which check sees it first can differ between releases)
PLANTED = [
    ("kernel_all_gather.py", "one receive semaphore for every ring step",
     "send_sem, recv_sems.at[s],", "send_sem, recv_sems.at[0],",
     ("race",)),
    ("kernel_all_gather.py", "the wrong slot forwarded",
     "slot = lax.rem(me - s + n, n)", "slot = lax.rem(me + s, n)",
     ("wrong values", "race")),
    ("kernel_all_gather.py", "the receive wait dropped (only the send waited)",
     "            dma.wait()  #", "            dma.wait_send()  #", ("race", "NaN")),
    ("kernel_all_gather.py", "two devices writing one buffer (everyone sends to 0)",
     "device_id={axis: right})", "device_id={axis: 0})",
     ("race", "hang")),
    ("kernel_all_gather.py", "a wait for a signal nobody sends",
     "    pl.semaphore_wait(barrier, 2)", "    pl.semaphore_wait(barrier, 3)",
     ("hang",)),
]

NOT_CAUGHT: dict[str, str] = {
    "kernel_all_gather.py: the neighbour barrier dropped": (
        "the right answer in both DMA modes, with no race: a DMA into a peer "
        "that has not entered the kernel fails (eager mode, KeyError) only "
        "when the peer's thread starts late, which on an idle CPU it does not. "
        "On a TPU it corrupts memory."),
}
"""Planted bugs no check here catches, and why (shown on the docs page)."""


def _planted(file_name, old, new):
    """The recipe file with ``old`` replaced by ``new``, as a fresh module."""
    text = FILES[file_name].read_text()
    assert text.count(old) == 1, f"{file_name} no longer holds {old!r} once"
    name = f"planted_{file_name[:-3]}_{abs(hash((old, new)))}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(compile(text.replace(old, new), str(FILES[file_name]), "exec"),
             module.__dict__)
    finally:
        del sys.modules[name]
    return module


def _gather(body, mesh, axis):
    return jax.jit(jax.shard_map(lambda x: body(x, axis=axis), mesh=mesh,
                                 in_specs=P(axis), out_specs=P(), check_vma=False))


@pytest.fixture(scope="module")
def gather_case():
    mesh = cx.make_mesh((8,), "i")
    x = np.arange(8 * 8 * 128, dtype=np.float32).reshape(64, 128)
    want = np.asarray(jax.jit(jax.shard_map(
        lambda b: lax.all_gather(b, "i", tiled=True), mesh=mesh, in_specs=P("i"),
        out_specs=P(), check_vma=False))(x))
    return mesh, x, want


def test_the_kernel_as_written_passes_every_check(gather_case):
    mesh, x, want = gather_case
    runs = check_kernel(_gather(cx.RECIPES["kernel_all_gather"].body, mesh, "i"), x,
                        expected=want, name="kernel_all_gather")
    assert [run.mode for run in runs] == ["on_wait", "eager"]
    assert all(not run.findings for run in runs)


@pytest.mark.parametrize("file_name,bug,old,new,found", PLANTED,
                         ids=[case[1] for case in PLANTED])
def test_each_planted_bug_is_caught(file_name, bug, old, new, found, gather_case,
                                    monkeypatch):
    mesh, x, want = gather_case
    module = _planted(file_name, old, new)
    # a hang is stopped after a few seconds; a correct run (compiled before the
    # limit starts) takes a fraction of one
    monkeypatch.setenv("COLLECTIVES_KERNEL_TIMEOUT", "4")
    with pytest.raises(KernelBugError) as caught:
        check_kernel(_gather(module.kernel_all_gather_body, mesh, "i"), x,
                     expected=want, name=f"kernel_all_gather with {bug}")
    assert any(word in str(caught.value) for word in found), str(caught.value)
    # and interpret mode is usable again afterwards
    check_kernel(_gather(cx.RECIPES["kernel_all_gather"].body, mesh, "i"), x,
                 expected=want, modes=("on_wait",))


def test_a_hung_kernel_under_check_is_stopped_with_the_fix_named(monkeypatch):
    module = _planted("kernel_all_gather.py", "    pl.semaphore_wait(barrier, 2)",
                      "    pl.semaphore_wait(barrier, 3)")
    recipe = cx.RECIPES["kernel_all_gather"]
    import dataclasses
    hung = dataclasses.replace(recipe, name="kernel_all_gather_hung",
                               body=module.kernel_all_gather_body)
    monkeypatch.setenv("COLLECTIVES_KERNEL_TIMEOUT", "5")
    mesh = cx.make_mesh((8,), "i")
    x = np.ones((16, 4), np.float32)
    with pytest.raises(cx.KernelTimeout, match="PJRT_NPROC") as caught:
        hung.shard_map(x, mesh=mesh)
    assert "kernel_all_gather_hung" in str(caught.value)
    # the next kernel runs
    np.testing.assert_array_equal(np.asarray(recipe.shard_map(x, mesh=mesh)), x)


def test_check_kernel_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match=r"modes=.*'sometimes'"):
        check_kernel(lambda: None, modes=("sometimes",))
