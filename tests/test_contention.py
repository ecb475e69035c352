"""Every recipe agrees with its oracle again and again while other processes
compete for the cores.

A row that is wrong once and right the next time is a bug, never noise: the
slow test runs every recipe's ``check`` row five times (the ring and pipeline
recipes, whose shard_map bodies pass blocks with ``ppermute`` in a loop, at
every standard mesh) beside busy processes, and wants no wrong row. The
harness is ``tools/contention.py``; a form planted to answer wrongly on one
call of five shows that it sees such a row."""

import os

import numpy as np
import pytest
from hypothesis import settings

import collectives as cx
from helpers import ROOT
from helpers import SLOW
from helpers import load_file
from helpers import only_with_marker

contention = load_file(ROOT / "tools" / "contention.py", "contention")

REPS = 5
FULL = ("ring_attention", "ring_attention_causal", "pipeline_mlp")
"""Checked at every standard mesh: the recipes whose wrong rows were seen."""


@pytest.mark.slow
def test_every_recipe_agrees_five_times_beside_busy_processes(request):
    if settings.get_current_profile_name() != "deep":  # (the deep run: always)
        only_with_marker(request, "slow", SLOW)
    with contention.busy(2):
        ran, wrong = contention.wrong_rows(list(cx.RECIPES), reps=REPS, full=FULL)
    assert ran >= REPS * len(cx.RECIPES)
    assert not wrong, "\n".join(  # each asked again here: its program or its run?
        f"rep {rep}: {row.recipe} mesh={row.mesh} axis={row.axis}: {row.detail}\n"
        f"  asked again: {contention.diagnose(row)}" for rep, row in wrong)


def _sign_flipped_on(call: int):
    """``check``'s forms, the shard_map form's result negated on its
    ``call``-th call (counting from 1)."""
    calls = []

    def forms(recipe, axes):
        bound = recipe.bound_forms(axes)
        honest = bound["shard_map"]

        def shard_map(*args):
            calls.append(None)
            out = honest(*args)
            return -np.asarray(out) if len(calls) == call else out

        return {**bound, "shard_map": shard_map}

    return forms


def test_a_form_wrong_on_one_call_of_five_is_reported():
    with contention.busy(1) as pids:
        assert len(pids) == 1
        ran, wrong = contention.wrong_rows(["psum"], reps=REPS,
                                           forms=_sign_flipped_on(3))
    assert ran == REPS
    assert [(rep, row.recipe) for rep, row in wrong] == [(2, "psum")]
    assert "shard_map" in wrong[0][1].detail


def test_a_wrong_row_is_asked_again_in_its_process():
    # wrong on the first call only: right again, right recompiled, and the
    # programs' digests the same before and after (the run was wrong)
    forms = _sign_flipped_on(1)
    [row] = cx.check(["psum"], configs=[((4, 2), ("i", "j"), "j")], forms=forms)
    assert not row.ok and (row.mesh, row.axis) == ("4x2", "j")
    found = contention.diagnose(row, forms=forms)
    assert found["again"] and found["recompiled"]
    assert set(found["digests"]) == {"pmap", "shard_map", "jit", "explicit"}
    assert found["digests"] == found["digests_recompiled"]
    # the digest follows the program: another recipe's differs in every form
    other = contention.program_digests("pmax", contention.config_of(row))
    assert all(other[form] != found["digests"][form] for form in other)


def test_the_busy_processes_end_with_the_block():
    with contention.busy(2) as pids:
        pass
    for pid in pids:  # each was ended and waited for: its pid is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_recompiled_programs_are_compared_form_by_form(monkeypatch):
    assert contention.unstable_programs(["pmax"], recompiles=2) == {}
    # a digest that changes from one compile to the next is reported, by
    # recipe and mesh
    calls = []
    digests = contention.program_digests

    def drifting(name, config):
        calls.append(None)
        return {**digests(name, config), "shard_map": str(len(calls))}

    monkeypatch.setattr(contention, "program_digests", drifting)
    unstable = contention.unstable_programs(["pmax"], recompiles=2)
    assert set(unstable) == {("pmax", "8/i"), ("pmax", "4x2/i,j"),
                             ("pmax", "4x2/i"), ("pmax", "4x2/j")}
    assert all(len(found) == 2 for found in unstable.values())
