"""``plan --scaling-book``: the scaling book's critical batch sizes, from
compiled programs.

"How to Scale Your Model" (the JAX scaling book), part 5 "Training", finds
on TPU v5p (``C`` = 4.59e14 bf16 FLOP/s a chip, ``W`` = 1.8e11 bytes/s of
bidirectional ICI along one axis, latency left out) the tokens per chip
below which a strategy is communication-bound: ``C / W`` = 2550 for data
parallelism and FSDP over one axis, 850 over all three axes of the torus
(three times the links), and ``2 (C / W)^2 / F`` for FSDP with tensor
parallelism at the best split of the chips between the two, 940 for the MLP
of LLaMA-2 13B (``F`` = 13824). The plan computes the same thresholds from
its own compiled programs and cost models with the book's figures; this
module runs those plans and sets the two side by side, with the book's
formula recounted the plan's way where the two count differently.

Its GPU chapter ("How to Think About GPUs", LLM scaling on GPUs) finds for
H100s (``C`` = 9.9e14, a GPU's NVLink egress 4.5e11 bytes/s, a node's
network egress 4e11: eight 400 Gb/s NICs; latency left out) the same bound
for data parallelism and FSDP, ``C / W``: 2200 tokens per GPU inside a
node, 2475 across nodes. Those cases run on the package's default profiles
(``nvlink-h100`` inside the node, ``ib-ndr`` across: a NIC a GPU), their
latency left out as the book leaves it out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from collectives.plan._model import MODELS
from collectives.plan._plan import plan
from collectives.plan._profiles import Link
from collectives.plan._profiles import Profile
from collectives.plan._profiles import load_profiles

PEAK = 4.59e14
"""The book's TPU v5p: bf16 FLOP/s a chip."""
ICI = 1.8e11
"""The book's TPU v5p: bidirectional ICI bandwidth along one axis, bytes/s."""
DEVICES = 256
"""The chips each case is planned on (the thresholds are per chip; 256
keeps LLaMA-2 13B's F = 13824 divisible by every split tried)."""
SPLITS = (2, 4, 8, 16)
"""The tensor-parallel degrees tried for FSDP x TP (the book's optimum,
``sqrt(2 F / (C/W)^2 ...)``, lies between them)."""


def book_profile(axes: int) -> Profile:
    """The book's v5p link over ``axes`` axes of the torus (``axes`` times
    the bandwidth), with its chip's peak."""
    return Profile(
        name=f"scaling-book-v5p-x{axes}", link=Link(alpha=0.0, busbw=axes * ICI),
        description=f"TPU v5p ICI over {axes} torus "
                    f"ax{'is' if axes == 1 else 'es'}, as the scaling book counts it",
        source="the scaling book, part 5: W_ici = 2 x 9e10 bytes/s per axis, "
               "latency left out",
        chip="TPU v5p", peak_flops={"bfloat16": PEAK},
        peak_source="the scaling book: C = 4.59e14 bf16 FLOP/s")


GPU_PEAK = 9.9e14
"""The book's H100: bf16 FLOP/s a GPU."""
NVLINK = 4.5e11
"""The book's H100: a GPU's NVLink egress, bytes/s."""
NODE_NETWORK = 4e11
"""The book's H100 node: its eight 400 Gb/s NICs, bytes/s."""
GPU_DEVICES = 2048
"""The GPUs the across-nodes cases are planned on: 256 nodes of 8."""


def without_latency(profile: Profile) -> Profile:
    """``profile`` with every kind's latency left out, as the book leaves
    it out."""
    def bare(link: Link) -> Link:
        return Link(alpha=0.0, busbw=link.busbw)

    return dataclasses.replace(
        profile, link=bare(profile.link),
        kinds={kind: bare(link) for kind, link in profile.kinds.items()},
        description=f"{profile.description}; latency left out")


@dataclasses.dataclass(frozen=True)
class Case:
    """One threshold of the book's, and the plan's for the same layout."""

    name: str
    book: float
    book_formula: str
    plan: float
    plan_how: str
    why: str
    counted: float = 0.0
    """The book's formula with the plan's accounting where the two differ
    (named in ``why``), at the plan's layout: what ``plan`` must equal."""

    @property
    def ratio(self) -> float:
        return self.plan / (self.counted or self.book)


def _all_overlapped(row) -> float:
    """Tokens per device below which the step's collectives, every one
    overlapped as the book assumes, outlast its computation: the FSDP part
    does not grow with the tokens, the tensor-parallel part and the
    computation do (infinite where the latter outgrows the computation)."""
    hidden = row.comm_s - row.serial_s
    if row.compute_s <= row.serial_s:  # the sums alone outlast it: at any size
        return math.inf
    return row.tokens_per_device * hidden / (row.compute_s - row.serial_s)


def cases(timeout: float = 600) -> list[Case]:
    """Plan each of the book's layouts with its figures; the cases."""
    model = MODELS["llama2-13b"]
    one, three = book_profile(1), book_profile(3)
    mesh = {"data": DEVICES}
    by_one = plan(model, mesh, interconnect=one, recipes=["dp_mlp", "fsdp_mlp"],
                  timeout=timeout)
    by_three = plan(model, mesh, interconnect=three, recipes=["fsdp_mlp"],
                    timeout=timeout)
    alpha = PEAK / ICI
    ring = f"the ring's (n - 1)/n at n = {DEVICES}"
    out = [
        Case("DP, one axis", alpha, "C / W",
             by_one.row("DP").critical_tokens_per_device,
             "gradient all-reduce against the backward pass",
             f"{ring}; the first layer's input gradient, which no program "
             "computes, is left out of the backward pass hiding the sum"),
        Case("FSDP, one axis", alpha, "C / W",
             by_one.row("FSDP").critical_tokens_per_device,
             "gathers, re-gathers and reduce-scatters against the step",
             f"{ring}; the model's first layer needs no re-gather"),
        Case("FSDP, three axes", alpha / 3, "C / 3W",
             by_three.row("FSDP").critical_tokens_per_device,
             "as above, with three axes' links",
             f"{ring}; the model's first layer needs no re-gather"),
    ]
    best, chosen = math.inf, SPLITS[0]
    for split in SPLITS:
        links = {"data": book_profile(2), "model": one}
        p = plan(model, {"data": DEVICES // split, "model": split},
                 interconnect=links, recipes=["fsdp_tp_mlp"], timeout=timeout)
        row = p.row("FSDP x TP")
        found = math.inf if row.skipped else _all_overlapped(row)
        if found < best:
            best, chosen = found, split
    # the book: alpha / (M_X b Y) + alpha Y / (M_Y F) < 1 (M_X = 2: data over
    # two torus axes, M_Y = 1); the plan sums [t, D] twice a block (forward
    # and backward) against the step's 6 FLOPs a parameter and token, where
    # the book sets one gather and one scatter against the forward's 2, and
    # keeps the ring's (Y - 1)/Y: 2 (Y - 1) / 3Y of the book's second term
    sums = alpha * chosen / model.ffn * 2 * (chosen - 1) / (3 * chosen)
    out.append(Case(
        "FSDP x TP, LLaMA-2 13B", 2 * alpha ** 2 / model.ffn, "2 (C/W)^2 / F",
        best, f"the fewest of data x model with {', '.join(map(str, SPLITS))}-way "
        f"tensor parallelism (here {chosen}-way), every collective overlapped as "
        "the book assumes; data over two torus axes, model over one",
        "the book's tensor-parallel term, alpha Y / (M_Y F), compares the forward "
        "pass's gather and scatter with its FLOPs and drops the ring's (Y - 1)/Y; "
        "the plan counts a whole step (two sums of [t, D] a block against 6 "
        "FLOPs a parameter and token) with it: 2 (Y - 1) / 3Y of the book's term. "
        "With that, the book's inequality gives alpha / (2 Y (1 - term)) at the "
        "plan's Y; the book's figure is its optimum over a continuous Y",
        counted=alpha / (2 * chosen * (1 - sums))))
    return out + gpu_cases(timeout)


def gpu_cases(timeout: float = 600) -> list[Case]:
    """The GPU chapter's bounds, planned on the default profiles (latency
    left out): DP inside one node, DP and FSDP over 256 nodes, of the 8B
    model (the bounds do not depend on it; LLaMA-2 13B's F = 13824 does not
    split 2048 ways)."""
    model = MODELS["8b"]
    profiles = load_profiles()
    nvlink = without_latency(profiles["nvlink-h100"])
    ib = without_latency(profiles["ib-ndr"])
    peak = nvlink.peak(model.dtype) or GPU_PEAK
    node = plan(model, {"data": 8}, interconnect=nvlink, recipes=["dp_mlp"],
                timeout=timeout)
    mesh = {"data": GPU_DEVICES // 8, "model": 8}
    nodes = plan(model, mesh, interconnect={"data": ib, "model": nvlink},
                 recipes=["dp_mlp", "fsdp_mlp"], timeout=timeout)
    chip = (f"the profiles' H100 ({peak / 1e12:.1f} TFLOP/s, the book's 990) and "
            "rings' (n - 1)/n")
    across = mesh["data"]
    # across the nodes each GPU sums (gathers, scatters) an eighth of the
    # data over its own NIC: the node's eight NICs together, as the book has
    # it, at ib-ndr's 50 GB/s a NIC
    by_nic = peak / (8 * ib.link.busbw) * (across - 1) / across
    return [
        Case("DP, one H100 node", GPU_PEAK / NVLINK, "C / W_NVLink",
             node.row("DP").critical_tokens_per_device,
             "gradient all-reduce over NVLink against the backward pass",
             f"{chip} at n = 8; the first layer's input gradient, which no "
             "program computes, is left out of the backward pass hiding the sum",
             counted=peak / nvlink.link.busbw * 7 / 8),
        Case("DP, 2048 H100s", GPU_PEAK / NODE_NETWORK, "C / W_node",
             nodes.row("DP").critical_tokens_per_device,
             "the all-reduce in phases: NVLink inside the node, an eighth of it "
             "across the nodes on each GPU's NIC, pipelined",
             f"{chip} at n = {across} nodes; the first layer's input gradient",
             counted=by_nic),
        Case("FSDP, 2048 H100s", GPU_PEAK / NODE_NETWORK, "C / W_node",
             nodes.row("FSDP").critical_tokens_per_device,
             "gathers, re-gathers and reduce-scatters in phases against the step",
             f"{chip} at n = {across} nodes; the model's first layer needs no "
             "re-gather", counted=by_nic),
    ]


def table_lines(found: Sequence[Case]) -> list[str]:
    """The comparison as text."""
    lines = [f"# the scaling book (part 5, TPU v5p: C = {PEAK:.3g} FLOP/s, W = "
             f"{ICI:.2g} B/s; its GPU chapter, H100: C = {GPU_PEAK:.2g}, W = "
             f"{NVLINK:.2g} B/s inside a node, {NODE_NETWORK:.2g} a node across) "
             "and this plan: tokens per chip below which each layout is "
             "communication-bound",
             f"{'layout':24s}  {'book':>8s}  {'book, as the plan counts':>24s}  "
             f"{'plan':>8s}  plan/that"]
    for case in found:
        lines.append(f"{case.name:24s}  {case.book:8,.0f}  "
                     f"{case.counted or case.book:24,.0f}  {case.plan:8,.0f}  "
                     f"{case.ratio:9.3f}")
    for case in found:
        lines.append(f"# {case.name}: book {case.book_formula}; plan: "
                     f"{case.plan_how}; differs by {case.why}")
    return lines


def as_json(found: Sequence[Case]) -> dict[str, Any]:
    return {"peak": PEAK, "ici": ICI, "devices": DEVICES, "gpu_peak": GPU_PEAK,
            "nvlink": NVLINK, "node_network": NODE_NETWORK,
            "gpu_devices": GPU_DEVICES,
            "cases": [dataclasses.asdict(c) | {"ratio": c.ratio} for c in found]}
