"""The cost models hold at scale: every strategy recipe compiled for 8, 64,
256 and 2048 simulated devices (abstract inputs, compile only), both placed
forms, and its compiled collectives and bytes per device compared with the
recipe's cost model, as the conformance suite does on 8 devices.

Marked ``scale`` (``-m scale``; CI runs them in one pytest run with the
documented commands, ``-m "scale or documented"``; alone they take about a
minute and a half on 2 cores). Each device count compiles in one child
process (:func:`collectives.plan.compile_units`) over two meshes: the plan's
``data x model`` (8 devices on ``model`` from 64 up), where strategies over
one axis run over ``model``, and a 1-D mesh of every device.

Documented exceptions (``LONGEST_AXIS``), of compile time, not of the
cost model: the ring recipes (``pipeline_mlp``, ``ring_attention``,
``ring_attention_causal``) unroll one step per device along their axis, so
a 1-D ring of 256 devices compiles 510 permutes and takes about a minute
(2048: far longer); XLA:CPU writes an all-to-all as a tuple of one buffer
per device, so a 2048-way all-to-all (``all_to_all_attention``,
``moe_layer``) takes 70-85 s. Past those sizes they are compiled over the
8-device axis only, which is how such layouts run (a ring or the experts
inside a node, other parallelism across nodes).
"""

import json
import resource

import pytest

import collectives as cx
import collectives.plan
from collectives.plan import compile_units
from helpers import only_with_marker
from helpers import run_python

FORMS = ("shard_map", "jit")
SIZES = (8, 64, 256, 2048)
LONGEST_AXIS = {"pipeline_mlp": 64, "ring_attention": 64, "ring_attention_causal": 64,
                "all_to_all_attention": 256, "moe_layer": 256}
"""The longest 1-D mesh each of these recipes is compiled over (see above)."""
STRATEGIES = sorted(name for name, r in cx.RECIPES.items()
                    if r.family == "strategy" or r.plan is not None)


def meshes(devices):
    inner = 2 if devices == 8 else 8
    yield ("data", "model"), (devices // inner, inner), STRATEGIES
    one_axis = [n for n in STRATEGIES if devices <= LONGEST_AXIS.get(n, devices)]
    yield ("i",), (devices,), one_axis


def test_every_strategy_recipe_is_covered():
    assert len(STRATEGIES) >= 10
    assert {"fsdp_mlp", "pipeline_mlp", "moe_layer", "dp_adam"} <= set(STRATEGIES)


@pytest.mark.scale
@pytest.mark.parametrize("devices", SIZES)
def test_compiled_bytes_meet_the_cost_model_at_scale(request, devices):
    only_with_marker(request, "scale", "CI runs them")
    ran = {name: 0 for name in STRATEGIES}
    problems = []
    for names, shape, recipes in meshes(devices):
        doc = compile_units(names, shape, recipes=recipes, forms=FORMS, timeout=900)
        assert doc["devices"] == devices
        for unit in doc["units"]:
            if "skipped" in unit:
                # a layout the recipe does not take (DP x TP on one axis)
                assert "does not fit" not in unit["skipped"], unit
                continue
            ran[unit["recipe"]] += 1
            if unit["cost_model"] is not None:
                mesh = dict(zip(names, shape, strict=True))
                problems.append(
                    f"{unit['recipe']} {unit['form']} on {mesh}: {unit['cost_model']}")
    assert not problems, "\n".join(problems)
    nowhere = [name for name, count in ran.items() if not count]
    assert not nowhere, f"compiled nowhere: {nowhere}"


@pytest.mark.scale
def test_plan_of_2048_devices_prints_every_strategy_within_4_gib(request, tmp_path):
    only_with_marker(request, "scale", "CI runs them")
    out = tmp_path / "plan.json"
    done = run_python("-m", "collectives", "plan", "--devices", "2048",
                      "--json", str(out), timeout=300)
    rows = {line.split("  ")[0]: line for line in done.stdout.splitlines()
            if not line.startswith("#")}
    for label in ("DP", "FSDP", "FSDP x TP", "PP", "SP ring", "EP (MoE)"):
        assert label in rows and rows[label].endswith("holds"), done.stdout
    assert "data=256 x model=8 (2048 devices)" in done.stdout
    # FSDP sends the textbook's 3 (n-1)/n of the parameters a step in the
    # target's program (XLA:CPU merges its re-gathers), less the model's
    # first layer's re-gather
    model, n = cx.plan.MODELS["8b"], 2048
    fsdp = {row["label"]: row for row in
            json.loads(out.read_text())["plans"][0]["rows"]}["FSDP"]
    whole = model.parameters * model.itemsize
    first = (model.width * model.ffn + model.ffn) * model.itemsize
    assert fsdp["sent"] == pytest.approx((n - 1) / n * (3 * whole - first), rel=1e-5)
    for key in ("compute_s", "comm_s", "step_s", "mfu",
                "critical_tokens_per_device", "memory_bytes"):
        assert fsdp[key] is not None, key
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert peak < 4 * 2**30, f"a child process peaked at {peak / 2**30:.2f} GiB"
