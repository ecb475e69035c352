"""``plan --scaling-book``: the scaling book's critical batch sizes, from
compiled programs.

"How to Scale Your Model" (the JAX scaling book), part 5 "Training", finds
on TPU v5p (``C`` = 4.59e14 bf16 FLOP/s a chip, ``W`` = 1.8e11 bytes/s of
bidirectional ICI along one axis, latency left out) the tokens per chip
below which a strategy is communication-bound: ``C / W`` = 2550 for data
parallelism and FSDP over one axis, 850 over all three axes of the torus
(three times the links), and ``2 (C / W)^2 / F`` for FSDP with tensor
parallelism at the best split of the chips between the two, 940 for the MLP
of LLaMA-2 13B (``F`` = 13824), from the forward pass alone ("it has the
most communication per FLOP"). The book charges a collective its whole
buffer (``V / W``, the ring's ``(n - 1)/n`` left out). The plan computes the
same thresholds from its compiled programs with the book's figures and
counted as the book counts (whole buffers; for FSDP x TP the collectives the
compiled program runs in its forward pass, by the names JAX gives them);
this module runs those plans and sets them beside the book's, and beside
each the plan's threshold for a whole step as its devices send it, which
differs where the book's simplifications matter (a ring of few devices; a
backward pass with fewer activation sums per FLOP than the forward).

Its GPU chapter ("How to Think About GPUs", LLM scaling on GPUs) finds for
H100s (``C`` = 9.9e14, a GPU's NVLink egress 4.5e11 bytes/s, a node's
network egress 4e11: eight 400 Gb/s NICs; latency left out) the same bound
for data parallelism and FSDP, ``C / W``: 2200 tokens per GPU inside a
node, 2475 across nodes. Those cases run on the package's default profiles
(``nvlink-h100`` inside the node, ``ib-ndr`` across: a NIC a GPU), their
latency left out and their buffers whole, as the book counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from collectives.plan._model import MODELS
from collectives.plan._plan import plan_each
from collectives.plan._profiles import Link
from collectives.plan._profiles import Profile
from collectives.plan._profiles import load_profiles

PEAK = 4.59e14
"""The book's TPU v5p: bf16 FLOP/s a chip."""
ICI = 1.8e11
"""The book's TPU v5p: bidirectional ICI bandwidth along one axis, bytes/s."""
DEVICES = 256
"""The chips each data-parallel case is planned on (the thresholds are per
chip)."""
SPLITS = (2, 3, 4, 6, 8)
"""The tensor-parallel degrees tried for FSDP x TP (the book's optimum,
``sqrt(F / (M_X b))``, is 2.7 at its threshold)."""
FSDP_WAYS = 64
"""The data axis beside each tensor-parallel degree: LLaMA-2 13B's biases
of F = 13824 split over both axes, 64 times every degree tried."""


def book_profile(axes: int, *, whole_buffers: bool = True) -> Profile:
    """The book's v5p link over ``axes`` axes of the torus (``axes`` times
    the bandwidth), with its chip's peak; ``whole_buffers``: each
    collective charged its whole buffer, as the book charges it (``False``:
    what a device sends, the ring's ``(n - 1)/n``)."""
    return Profile(
        name=f"scaling-book-v5p-x{axes}", link=Link(alpha=0.0, busbw=axes * ICI),
        description=f"TPU v5p ICI over {axes} torus "
                    f"ax{'is' if axes == 1 else 'es'}, as the scaling book counts it",
        source="the scaling book, part 5: W_ici = 2 x 9e10 bytes/s per axis, "
               "latency left out",
        chip="TPU v5p", peak_flops={"bfloat16": PEAK},
        peak_source="the scaling book: C = 4.59e14 bf16 FLOP/s",
        whole_buffers=whole_buffers)


GPU_PEAK = 9.9e14
"""The book's H100: bf16 FLOP/s a GPU."""
NVLINK = 4.5e11
"""The book's H100: a GPU's NVLink egress, bytes/s."""
NODE_NETWORK = 4e11
"""The book's H100 node: its eight 400 Gb/s NICs, bytes/s."""
GPU_DEVICES = 2048
"""The GPUs the across-nodes cases are planned on: 256 nodes of 8."""


def as_the_book_counts(profile: Profile, *, whole_buffers: bool = True) -> Profile:
    """``profile`` with every kind's latency left out, as the book leaves it
    out; ``whole_buffers`` as in :func:`book_profile`."""
    def bare(link: Link) -> Link:
        return Link(alpha=0.0, busbw=link.busbw)

    return dataclasses.replace(
        profile, link=bare(profile.link),
        kinds={kind: bare(link) for kind, link in profile.kinds.items()},
        description=f"{profile.description}; latency left out",
        whole_buffers=whole_buffers)


@dataclasses.dataclass(frozen=True)
class Case:
    """One threshold of the book's, and the plan's for the same layout.

    Attributes:
      book: the book's tokens per chip, by ``book_formula``.
      plan: the plan's, its compiled programs counted as the book counts
        (``plan_how``): each collective its whole buffer, the pass the
        book models; what ``ratio`` compares with the book's.
      compiled: the plan's as it plans a step: every byte a device sends
        (the ring's ``(n - 1)/n``) over the whole step; ``why`` says how
        and why it differs from the book's.
    """

    name: str
    book: float
    book_formula: str
    plan: float
    plan_how: str
    compiled: float
    why: str

    @property
    def ratio(self) -> float:
        return self.plan / self.book


def _critical(plan, label: str) -> float:
    return plan.row(label).critical_tokens_per_device


def _bound(tokens: float, hidden: float, serial: float, compute: float) -> float:
    """Tokens per device below which collectives that all overlap the
    computation outlast it: ``hidden`` seconds that do not grow with the
    tokens (gathers, gradient sums), ``serial`` and ``compute`` that do
    (activation sums, matmuls); infinite where the former outgrow the
    computation at any size."""
    if compute <= serial:
        return math.inf
    return tokens * hidden / (compute - serial)


def _all_overlapped(row) -> float:
    """The whole step's bound, every collective overlapped as the book
    assumes."""
    return _bound(row.tokens_per_device, row.comm_s - row.serial_s, row.serial_s,
                  row.compute_s)


def _forward_bound(row, peak: float) -> float:
    """The forward pass's bound, as the book counts FSDP x TP ("we'll purely
    model the forward pass since it has the most communication per FLOP"):
    the collectives the compiled program runs in its forward pass against
    the model's forward FLOPs (a third of a step's)."""
    forward = row.phases.get("forward")
    if not forward or row.model_flops is None:
        raise ValueError(f"{row.label}: the compiled program names no forward "
                         "pass (no op_name metadata on its collectives)")
    return _bound(row.tokens_per_device, forward["hidden_s"], forward["serial_s"],
                  row.model_flops / 3 / peak)


def fsdp_tp_bounds(timeout: float = 600) -> tuple[dict[int, float], dict[int, float]]:
    """FSDP x TP of LLaMA-2 13B at each of :data:`SPLITS`: the forward
    pass's bound counted as the book counts (whole buffers), and the whole
    step's as sent, each by tensor-parallel degree."""
    model = MODELS["llama2-13b"]
    forward, step = {}, {}
    for split in SPLITS:
        as_book, as_sent = plan_each(
            model, {"data": FSDP_WAYS, "model": split},
            interconnects=[{"data": book_profile(2), "model": book_profile(1)},
                           {"data": book_profile(2, whole_buffers=False),
                            "model": book_profile(1, whole_buffers=False)}],
            recipes=["fsdp_tp_mlp"], timeout=timeout)
        row, sent = as_book.row("FSDP x TP"), as_sent.row("FSDP x TP")
        if row.skipped:
            raise ValueError(f"FSDP x TP, {split}-way: {row.skipped}")
        forward[split] = _forward_bound(row, PEAK)
        step[split] = _all_overlapped(sent)
    return forward, step


def cases(timeout: float = 600) -> list[Case]:
    """Plan each of the book's layouts with its figures; the cases."""
    model = MODELS["llama2-13b"]
    one, three = book_profile(1), book_profile(3)
    mesh = {"data": DEVICES}
    by_one, sent_one = plan_each(
        model, mesh, interconnects=[one, book_profile(1, whole_buffers=False)],
        recipes=["dp_mlp", "fsdp_mlp"], timeout=timeout)
    by_three, sent_three = plan_each(
        model, mesh, interconnects=[three, book_profile(3, whole_buffers=False)],
        recipes=["fsdp_mlp"], timeout=timeout)
    alpha = PEAK / ICI
    ring = f"the ring's (n - 1)/n at n = {DEVICES}"

    out = [
        Case("DP, one axis", alpha, "C / W", _critical(by_one, "DP"),
             "gradient all-reduce against the backward pass",
             _critical(sent_one, "DP"),
             f"{ring}; the first layer's input gradient, which no program "
             "computes, is left out of the backward pass hiding the sum"),
        Case("FSDP, one axis", alpha, "C / W", _critical(by_one, "FSDP"),
             "gathers, re-gathers and reduce-scatters against the step",
             _critical(sent_one, "FSDP"),
             f"{ring}; the model's first layer needs no re-gather"),
        Case("FSDP, three axes", alpha / 3, "C / 3W", _critical(by_three, "FSDP"),
             "as above, with three axes' links", _critical(sent_three, "FSDP"),
             f"{ring}; the model's first layer needs no re-gather"),
    ]
    forward, step = fsdp_tp_bounds(timeout)
    best, least = min(forward, key=forward.get), min(step, key=step.get)
    splits = ", ".join(map(str, SPLITS))
    out.append(Case(
        "FSDP x TP, LLaMA-2 13B", 2 * alpha ** 2 / model.ffn, "2 (C/W)^2 / F",
        forward[best], f"the forward pass's gathers and activation sums, as "
        "compiled, against its FLOPs, every collective overlapped, the fewest "
        f"tokens of {splits}-way tensor parallelism ({best}-way) beside "
        f"{FSDP_WAYS}-way FSDP; data over two torus axes, model over one",
        step[least],
        "the whole step, where the book models the forward pass alone, and the "
        "ring's (Y - 1)/Y, which the book drops: a step sums [t, D] twice a "
        "block (forward and backward) against 6 FLOPs a parameter and token, "
        f"the forward pass once against 2, and a {least}-way ring sends "
        "(Y - 1)/Y of it; the forward pass turns communication-bound first, "
        f"the whole step at fewer tokens ({least}-way)"))
    return out + gpu_cases(timeout)


def gpu_cases(timeout: float = 600) -> list[Case]:
    """The GPU chapter's bounds, planned on the default profiles (latency
    left out): DP inside one node, DP and FSDP over 256 nodes, of the 8B
    model (the bounds do not depend on it; LLaMA-2 13B's F = 13824 does not
    split 2048 ways)."""
    model = MODELS["8b"]
    profiles = load_profiles()
    nvlink, ib = profiles["nvlink-h100"], profiles["ib-ndr"]

    def links(**kw):
        return (as_the_book_counts(nvlink, **kw), as_the_book_counts(ib, **kw))

    (nv_book, ib_book), (nv_sent, ib_sent) = links(), links(whole_buffers=False)
    peak = nv_book.peak(model.dtype) or GPU_PEAK
    node, node_sent = plan_each(model, {"data": 8}, interconnects=[nv_book, nv_sent],
                                recipes=["dp_mlp"], timeout=timeout)
    mesh = {"data": GPU_DEVICES // 8, "model": 8}
    nodes, nodes_sent = plan_each(
        model, mesh, interconnects=[{"data": ib_book, "model": nv_book},
                                    {"data": ib_sent, "model": nv_sent}],
        recipes=["dp_mlp", "fsdp_mlp"], timeout=timeout)
    chip = (f"the profiles' H100 ({peak / 1e12:.1f} TFLOP/s, the book's 990) and "
            "rings' (n - 1)/n")
    across = mesh["data"]

    return [
        Case("DP, one H100 node", GPU_PEAK / NVLINK, "C / W_NVLink",
             _critical(node, "DP"),
             "gradient all-reduce over NVLink against the backward pass",
             _critical(node_sent, "DP"),
             f"{chip} at n = 8; the first layer's input gradient, which no "
             "program computes, is left out of the backward pass hiding the sum"),
        Case("DP, 2048 H100s", GPU_PEAK / NODE_NETWORK, "C / W_node",
             _critical(nodes, "DP"),
             "the all-reduce in phases: NVLink inside the node, an eighth of it "
             "across the nodes on each GPU's NIC, pipelined",
             _critical(nodes_sent, "DP"),
             f"{chip} at n = {across} nodes; the first layer's input gradient"),
        Case("FSDP, 2048 H100s", GPU_PEAK / NODE_NETWORK, "C / W_node",
             _critical(nodes, "FSDP"),
             "gathers, re-gathers and reduce-scatters in phases against the step",
             _critical(nodes_sent, "FSDP"),
             f"{chip} at n = {across} nodes; the model's first layer needs no "
             "re-gather"),
    ]


def table_lines(found: Sequence[Case]) -> list[str]:
    """The comparison as text."""
    lines = [f"# the scaling book (part 5, TPU v5p: C = {PEAK:.3g} FLOP/s, W = "
             f"{ICI:.2g} B/s; its GPU chapter, H100: C = {GPU_PEAK:.2g}, W = "
             f"{NVLINK:.2g} B/s inside a node, {NODE_NETWORK:.2g} a node across) "
             "and this plan: tokens per chip below which each layout is "
             "communication-bound",
             f"{'layout':24s}  {'book':>8s}  {'plan, as the book counts':>24s}  "
             f"{'plan/book':>9s}  {'a step as sent':>14s}"]
    for case in found:
        lines.append(f"{case.name:24s}  {case.book:8,.0f}  {case.plan:24,.0f}  "
                     f"{case.ratio:9.3f}  {case.compiled:14,.0f}")
    for case in found:
        lines.append(f"# {case.name}: book {case.book_formula}; plan: "
                     f"{case.plan_how}; a step as sent differs by {case.why}")
    return lines


def as_json(found: Sequence[Case]) -> dict[str, Any]:
    return {"peak": PEAK, "ici": ICI, "devices": DEVICES, "gpu_peak": GPU_PEAK,
            "nvlink": NVLINK, "node_network": NODE_NETWORK,
            "gpu_devices": GPU_DEVICES,
            "cases": [dataclasses.asdict(c) | {"ratio": c.ratio} for c in found]}
