"""Bugs planted in the kernel recipes, one at a time, and what catches each.

Each case edits one line of a kernel's recipe file (the text must be there:
a case that no longer applies fails), loads the edited file as a module of
its own, and runs its kernel under :func:`collectives.testing.check_kernel`
against the ``lax`` collective's result. Every case must be caught, and by
what the table says (a race, NaN, a wrong value, an exception, a hang). The
bugs no check here catches are listed in ``NOT_CAUGHT`` with why; the docs
page "Collectives from the inside" shows the same table.
"""

import functools
import importlib.util
import sys

import jax
import numpy as np
import pytest

import collectives as cx
from collectives import _compat
from collectives.testing import KernelBugError
from collectives.testing import check_kernel
from helpers import RECIPE_FILES
from helpers import SLOW
from helpers import only_with_marker

pytestmark = pytest.mark.skipif(
    not _compat.HAS_INTERPRET_KERNELS,
    reason=f"the kernels need JAX 0.10.2 or newer (this is {jax.__version__})")

FILES = {path.name: path for path in RECIPE_FILES}

# (file, planted bug, text replaced, replacement, what must be reported: any
# of these words; which check sees it first can differ between releases and
# between runs: a ring step's wait that another step's signal satisfies
# reads its slot before the bytes land, which the race detector reports when
# the simulated devices' threads overlap there, and which otherwise leaves
# the NaN that fills unwritten memory in the result)
SHARED_SEMAPHORE = ("race", "NaN")
PLANTED = [
    ("kernel_all_gather.py", "one receive semaphore for every ring step",
     "send_sem, recv_sems.at[s],", "send_sem, recv_sems.at[0],",
     SHARED_SEMAPHORE),
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
    ("kernel_allgather_matmul.py", "one receive semaphore for every ring step",
     "recv_sems.at[jnp.minimum(s, n - 2)]", "recv_sems.at[0]", SHARED_SEMAPHORE),
    ("kernel_allgather_matmul.py", "one receive buffer for every block",
     "gathered.at[slot], gathered.at[slot], send_sem",
     "gathered.at[slot], gathered.at[0], send_sem", ("race", "wrong values")),
    ("kernel_allgather_matmul.py", "the receive wait dropped (only the send waited)",
     "send.wait()  # sent", "send.wait_send()  # sent", ("race", "NaN")),
    ("kernel_all_to_all.py", "the wrong slot written",
     "chunk(dst), out_ref.at[src], send_sem", "chunk(dst), out_ref.at[dst], send_sem",
     ("race", "wrong values", "NaN")),
    ("kernel_all_to_all.py", "the receive wait dropped",
     "            dma(lax.rem(me + n - s, n), me).wait_recv()\n", "",
     ("race", "NaN", "semaphore")),
    ("kernel_ppermute.py", "two devices writing one buffer (every pair sends to 0)",
     " " * 48 + "device_id={axis: d})", " " * 48 + "device_id={axis: 0})",
     ("race", "hang", "wrong values")),
    ("kernel_psum_scatter.py", "one receive slot for every ring step",
     "src, slots.at[s], send_sem,", "src, slots.at[0], send_sem,",
     ("race", "wrong values")),
    ("kernel_psum_scatter.py", "one receive semaphore for every ring step",
     "send_sem, recv_sems.at[s],", "send_sem, recv_sems.at[0],", SHARED_SEMAPHORE),
    ("kernel_psum_scatter.py", "the receive wait dropped (only the send waited)",
     "                dma.wait()", "                dma.wait_send()",
     ("race", "NaN")),
    ("kernel_psum.py", "one receive slot for every reduce-scatter step",
     "send_right(slots.at[s - 1], slots.at[s],",
     "send_right(slots.at[s - 1], slots.at[0],",
     ("race", "wrong values")),
    ("kernel_ppermute.py", "the receive wait dropped",
     "                to(s).wait_recv()", "                pass",
     ("race", "NaN", "semaphore")),
]

NOT_CAUGHT: dict[str, str] = {
    "kernel_all_gather.py: the neighbour barrier dropped": (
        "the right answer in both DMA modes, with no race: a DMA into a peer "
        "that has not entered the kernel fails (eager mode, KeyError) only "
        "when the peer's thread starts late, which on an idle CPU it does not. "
        "On a TPU it corrupts memory."),
    "kernel_psum.py: the all-gather reusing the reduce-scatter's semaphores": (
        "not caught reliably: the right answer with no race in both DMA "
        "modes in most runs (a rare on_wait run reports a race). A device's "
        "all-gather DMA counts towards a neighbour's reduce-scatter wait only "
        "when that neighbour lags a phase behind, which the simulator's "
        "threads seldom do; on a TPU it reads a slot before its bytes land."),
    "kernel_all_to_all.py: one receive semaphore for every source": (
        "not a bug in this kernel: semaphores count bytes, every source sends "
        "one chunk into a slot of its own, and nothing reads a slot before the "
        "last wait, so waiting n - 1 times on one semaphore waits for the same "
        "bytes. (In a ring, where each step forwards what it waited for, it is "
        "a race: kernel_all_gather.py's first planted bug.)"),
}
"""Planted bugs no check here catches, and why (shown on the docs page)."""

NO_PLANTED_BUGS_YET: set[str] = set()
"""Kernel files without planted bugs (none may be)."""


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


RECIPE_OF: dict[str, str] = {}  # each kernel file's first recipe
for _name, _recipe in cx.RECIPES.items():
    if _recipe.family == "kernel":
        RECIPE_OF.setdefault(_recipe.recipe_file, _name)


def _case(file_name, body=None):
    """The kernel of ``file_name`` (or ``body`` in its place) under shard_map on
    8 devices, exact-valued inputs of a few KiB a device, and the oracle's
    result."""
    recipe = cx.RECIPES[RECIPE_OF[file_name]]
    mesh = cx.make_mesh((8,), "i")
    axes = recipe.axes(mesh)
    args = recipe.example_args(mesh, exact=True, dims=(8, 128), seed=1)
    fn = jax.jit(jax.shard_map(
        functools.partial(body or recipe.body, axis=axes.axis), mesh=mesh,
        in_specs=recipe.in_specs(axes), out_specs=recipe.out_specs(axes),
        check_vma=False))
    return fn, args, recipe.reference(*args, mesh=mesh)


@pytest.mark.parametrize("file_name", sorted({case[0] for case in PLANTED}))
def test_the_kernel_as_written_passes_every_check(file_name):
    fn, args, want = _case(file_name)
    runs = check_kernel(fn, *args, expected=want, name=file_name)
    assert [run.mode for run in runs] == ["on_wait", "eager"]
    assert all(not run.findings for run in runs)


def test_every_kernel_file_has_planted_bugs():
    assert {case[0] for case in PLANTED} | {key.split(":")[0] for key in NOT_CAUGHT} \
        >= set(RECIPE_OF) - NO_PLANTED_BUGS_YET, sorted(RECIPE_OF)


def _in_default_suite(file_name, found):
    """kernel_all_gather's bugs whose report cannot be a hang run in the
    default suite; the others, whose cases mostly wait out a hang (both DMA
    modes, seconds each) or a detector, in CI's slow step (once, on the
    newest JAX).
    (A hung kernel stopped under ``check`` is in the default suite below.)"""
    return file_name == "kernel_all_gather.py" and "hang" not in found


@pytest.mark.parametrize("file_name,bug,old,new,found", [
    pytest.param(*case, id=f"{case[0][:-3]}: {case[1]}",
                 marks=() if _in_default_suite(case[0], case[4]) else pytest.mark.slow)
    for case in PLANTED])
def test_each_planted_bug_is_caught(file_name, bug, old, new, found, monkeypatch,
                                    request):
    if not _in_default_suite(file_name, found):
        only_with_marker(request, "slow", SLOW)
    module = _planted(file_name, old, new)
    body = getattr(module, cx.RECIPES[RECIPE_OF[file_name]].body.__name__)
    fn, args, want = _case(file_name, body)
    # a hang is stopped after a few seconds; a correct run (compiled before the
    # limit starts) takes a fraction of one
    monkeypatch.setenv("COLLECTIVES_KERNEL_TIMEOUT", "4")
    with pytest.raises(KernelBugError) as caught:
        check_kernel(fn, *args, expected=want, name=f"{file_name} with {bug}")
    assert any(word in str(caught.value) for word in found), str(caught.value)
    # and interpret mode is usable again afterwards
    fn, args, want = _case(file_name)
    check_kernel(fn, *args, expected=want, modes=("on_wait",))


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


# (planted bug, text replaced, replacement, the kind check's row must name)
UNDER_CHECK = [
    ("the send never waited (the kernel exits with its DMA in flight)",
     "            dma.wait()  #", "            dma.wait_recv()  #",
     ("semaphores left non-zero",)),
    ("one receive semaphore for every ring step",
     "send_sem, recv_sems.at[s],", "send_sem, recv_sems.at[0],",
     ("race", "unwritten memory")),
]


@pytest.mark.parametrize("bug,old,new,found", [
    pytest.param(*case, id=case[0], marks=() if i == 0 else pytest.mark.slow)
    for i, case in enumerate(UNDER_CHECK)])
def test_check_fails_a_kernel_row_naming_what_its_detectors_found(
        bug, old, new, found, monkeypatch, capsys, request):
    # The send never waited returns the right values: only the semaphore
    # left counting at the kernel's end tells, and check must say so.
    if bug != UNDER_CHECK[0][0]:
        only_with_marker(request, "slow", SLOW)
    import dataclasses

    from collectives._check import print_check
    from collectives._cli import build_parser

    module = _planted("kernel_all_gather.py", old, new)
    recipe = cx.RECIPES["kernel_all_gather"]
    planted = dataclasses.replace(recipe, name="kernel_all_gather_planted",
                                  body=module.kernel_all_gather_body)
    monkeypatch.setitem(cx.RECIPES._recipes, planted.name, planted)
    args = build_parser().parse_args(["check", planted.name, "--mesh", "8"])
    (row,) = print_check(args)
    out = capsys.readouterr().out
    assert not row.ok and not row.skipped, row
    assert any(word in row.detail for word in found), row.detail
    (line,) = [line for line in out.splitlines() if line.startswith(planted.name)]
    assert "FAIL (kernel: " in line and any(word in line for word in found), line
    # the recipe as written still passes, and interpret mode runs again
    (ok,) = cx.check([recipe.name], configs=[((8,), ("i",), None)])
    assert ok.ok, ok.detail
