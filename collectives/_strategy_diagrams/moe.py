"""Dispatch and combine of ``recipes/moe.py``, recorded from a real run.

:func:`trace` runs, under ``shard_map`` on ``n`` devices, the file's
``route`` and ``assign_slots`` (each device's routing decisions and the
capacity slot of each token) and the file's ``moe_body`` (the layer:
dispatch ``all_to_all``, expert FFN, combine ``all_to_all``), top-1, on
marker tokens whose outputs say where they went:

* channel 0 of every token is 1, channel 1 is the token's global id + 1,
  channel 2 is 0, and channels ``3 ..`` are routing scores, which the router
  ``router_w`` reads (identity into the ``E`` logits);
* expert ``j``'s FFN ``relu(x @ w_in[j]) @ w_out[j]`` keeps channels 0 and 1
  and writes ``j + 1`` into channel 2.

A token's output is ``gate * (1, id + 1, j + 1, 0, ..)``: divided by channel
0 (the gate) it names the token that came back to this row and the expert
that processed it. A dropped token's output is zeros. The file's NumPy
oracle ``moe_numpy`` runs on the same inputs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives.hlo import collective_stats
from collectives.recipes import moe as moe_file

CAPTION = (
    "A mixture-of-experts layer on 4 devices, one expert each, recorded from a "
    "real run: an all-to-all sends each token to its expert's buffer (2 slots "
    "per device and expert), the experts run their FFN, and a second all-to-all "
    "brings every kept token back to its own row. Tokens that find their "
    "expert's slots full are dropped and come back as zeros.")

_AXIS = "i"
_FIXED = 3  # channels: 1, token id + 1, expert tag; then the routing scores
DROPPED = -1
DROPPED_FACE, EMPTY_FACE = "#ffffff", "#eeeeee"


@dataclasses.dataclass(frozen=True)
class MoeTrace:
    """Where each token went in one top-1 MoE layer.

    Arrays are ``[n, t]``: device, then the device's local token. ``expert``
    and ``gate``: the file's ``route``; ``slot``: the token's slot in its
    expert's buffer from the file's ``assign_slots`` (``DROPPED`` past
    ``capacity``). From ``moe_body``'s outputs: ``returned_token`` (global
    id of the token whose result came back to this row) and
    ``returned_expert`` (the expert that processed it), ``DROPPED`` where the
    output is zeros; ``dropped`` is the layer's psum of dropped tokens,
    ``oracle_dropped`` the oracle's, and ``matches_oracle`` whether the
    outputs equal the oracle's.
    """

    n_devices: int
    n_experts: int
    capacity: int
    expert: np.ndarray
    gate: np.ndarray
    slot: np.ndarray
    returned_token: np.ndarray
    returned_expert: np.ndarray
    dropped: int
    oracle_dropped: int
    matches_oracle: bool
    all_to_alls: int = 0  # in the compiled layer
    all_to_all_bytes: float = 0.0  # bytes each device sends in them

    @property
    def tokens_per_device(self) -> int:
        return self.expert.shape[1]

    @property
    def experts_per_device(self) -> int:
        return self.n_experts // self.n_devices

    @property
    def home(self) -> np.ndarray:
        """``[n, t]``: each token's global id (its row of the layer)."""
        return np.arange(self.expert.size).reshape(self.expert.shape)

    @property
    def kept(self) -> np.ndarray:
        """``[n, t]``: the token has a slot (``assign_slots``)."""
        return self.slot != DROPPED

    def buffers(self) -> np.ndarray:
        """``[E, n, C]``: the local token index in slot ``c`` of expert ``j``'s
        buffer from source device ``d`` (what ``all_to_all`` delivers to
        expert ``j``'s device), ``DROPPED`` where the slot is empty."""
        out = np.full((self.n_experts, self.n_devices, self.capacity), DROPPED)
        for (d, i), j in np.ndenumerate(self.expert):
            if self.slot[d, i] != DROPPED:
                out[j, d, self.slot[d, i]] = i
        return out


def _marker_inputs(n: int, t: int, n_experts: int, seed: int):
    d = _FIXED + n_experts
    rng = np.random.default_rng(seed)
    x = np.zeros((n * t, d), np.float32)
    x[:, 0] = 1
    x[:, 1] = np.arange(n * t) + 1
    x[:, _FIXED:] = rng.standard_normal((n * t, n_experts))
    router_w = np.zeros((d, n_experts), np.float32)
    router_w[_FIXED:] = np.eye(n_experts)
    w_in = np.zeros((n_experts, d, 2), np.float32)
    w_in[:, 0, 0] = w_in[:, 1, 1] = 1  # hidden = relu(1, id + 1)
    w_out = np.zeros((n_experts, 2, d), np.float32)
    w_out[:, 0, 0] = w_out[:, 1, 1] = 1
    w_out[:, 0, 2] = np.arange(n_experts) + 1  # the expert's tag
    return router_w, w_in, w_out, x


@on_its_own_mesh
def trace(n_devices: int = 4, tokens_per_device: int = 8, n_experts: int = 4,
          capacity: int | None = None, seed: int = 4) -> MoeTrace:
    """Run the file's routing and ``moe_body`` (top-1) on ``n_devices``
    devices and record where each token went (see the module docstring).

    ``capacity`` defaults to the file's ``expert_capacity`` (capacity
    factor 1: ``ceil(t / E)``)."""
    n, t = n_devices, tokens_per_device
    mesh = make_mesh((n,), _AXIS)
    router_w, w_in, w_out, x = _marker_inputs(n, t, n_experts, seed)
    slots = moe_file.expert_capacity(t, n_experts, 1, capacity)

    def routing(router_w, x):
        gate, expert = moe_file.route(router_w, x)  # [t, 1] each
        mask, _ = moe_file.assign_slots(expert, n_experts, slots, x.dtype)
        return gate[:, 0], expert[:, 0], mask.sum(axis=1)  # mask: [t, C]

    by_device = P(_AXIS)
    gate, expert, slot_mask = jax.jit(jax.shard_map(
        routing, mesh=mesh, in_specs=(P(), by_device),
        out_specs=(by_device, by_device, by_device)))(router_w, x)
    layer = jax.jit(jax.shard_map(
        functools.partial(moe_file.moe_body, axis=_AXIS, capacity=slots), mesh=mesh,
        in_specs=(P(), by_device, by_device, by_device), out_specs=(by_device, P())))
    out, dropped = layer(router_w, w_in, w_out, x)
    stats = collective_stats(layer, router_w, w_in, w_out, x)
    out = np.asarray(out, np.float64)
    want, want_dropped = moe_file.moe_numpy(router_w, w_in, w_out, x, n, capacity=slots)

    slot_mask = np.asarray(slot_mask)
    slot = np.where(slot_mask.any(axis=1), slot_mask.argmax(axis=1), DROPPED)
    back = out[:, 0] != 0
    scale = np.where(back, out[:, 0], 1)
    returned_token = np.where(back, np.rint(out[:, 1] / scale) - 1, DROPPED)
    returned_expert = np.where(back, np.rint(out[:, 2] / scale) - 1, DROPPED)

    def grid(a):
        return np.asarray(a).reshape(n, t)

    return MoeTrace(
        n, n_experts, slots, grid(expert).astype(int), grid(gate).astype(float),
        grid(slot).astype(int), grid(returned_token).astype(int),
        grid(returned_expert).astype(int), int(dropped), int(want_dropped),
        bool(np.allclose(out, want, rtol=1e-5, atol=1e-6)),
        stats.count("all-to-all"), float(stats.bytes("all-to-all")))


def _title(record: MoeTrace) -> str:
    return (f"Mixture of experts, top-1: {record.n_devices} devices \u00d7 "
            f"{record.tokens_per_device} tokens, {record.n_experts} experts, "
            f"{record.capacity} slots per (device, expert): {record.dropped} of "
            f"{record.expert.size} tokens dropped")


def _device_of(record: MoeTrace, expert: int) -> int:
    return expert // record.experts_per_device


def text(record: MoeTrace) -> str:
    """The routing, the expert buffers and the combine as plain-text tables."""
    t, e = record.tokens_per_device, record.n_experts
    lines = [f"{_title(record)} (the single-device reference drops "
             f"{record.oracle_dropped})", "",
             "dispatch: token i of device d -> expert (its device), slot; "
             "x: dropped (capacity full)",
             "device | " + " ".join(f"{i:>7}" for i in range(t))]
    for d in range(record.n_devices):
        cells = []
        for i in range(t):
            j, s = record.expert[d, i], record.slot[d, i]
            where = f"E{j}(d{_device_of(record, j)})"
            cells.append(f"{where}{'x' if s == DROPPED else s}")
        lines.append(f"{d:>6} | " + " ".join(f"{c:>7}" for c in cells))
    lines += ["", "expert buffers after the dispatch all_to_all: local token ids "
              "from each source device's slots ('-': empty)",
              "expert (device) | " + " | ".join(
                  f"from d{d}" for d in range(record.n_devices))]
    buffers = record.buffers()
    for j in range(e):
        groups = [" ".join("-" if v < 0 else str(v) for v in buffers[j, d])
                  for d in range(record.n_devices)]
        lines.append(f"E{j} (d{_device_of(record, j)})".ljust(15) + " | "
                     + " | ".join(g.ljust(7) for g in groups))
    lines += ["", "combine: what came back to each token's row (token id via "
              "expert), 0: zeros (dropped)",
              "device | " + " ".join(f"{i:>7}" for i in range(t))]
    for d in range(record.n_devices):
        cells = ["0" if record.returned_token[d, i] == DROPPED else
                 f"{record.returned_token[d, i]}viaE{record.returned_expert[d, i]}"
                 for i in range(t)]
        lines.append(f"{d:>6} | " + " ".join(f"{c:>7}" for c in cells))
    home = record.returned_token[record.kept] == record.home[record.kept]
    lines.append(f"every kept token came back to its own row: {bool(home.all())}; "
                 f"outputs equal the oracle's: {record.matches_oracle}")
    lines.append(f"compiled layer: {record.all_to_alls} all-to-alls, "
                 f"{record.all_to_all_bytes:g} bytes sent per device")
    return "\n".join(lines)


def _bytes(n: float) -> str:
    return f"{n:,.0f} bytes" if n < 10_000 else f"{n / 1024:,.1f} KiB"


def draw(record: MoeTrace, path, width: str = "wide") -> None:
    """Write dispatch, expert buffers and combine as an SVG: three panels,
    side by side for the ``"wide"`` column, stacked for ``"narrow"``."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    place = _Placement.of(record, narrow=width == "narrow")
    fig = Figure(figsize=(place.fig_w, place.fig_h))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-0.2 / place.unit, place.across)
    ax.set_ylim(place.bottom, 0)
    ax.axis("off")
    sheet = _Sheet(ax, width, matplotlib.colormaps["tab10"])
    _dispatch_panel(sheet, record, place)
    _buffer_panel(sheet, record, place)
    _combine_panel(sheet, record, place)
    _moves(sheet, record, place)
    _titles(sheet, record, place)
    _legend(fig, sheet, record, place)
    _figure.save(fig, path)


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where the three panels go, in cell units (x right, y down; one unit is
    ``unit`` inches): side by side (wide) or stacked (narrow)."""

    narrow: bool
    unit: float
    across: float
    bottom: float
    gap: float  # between the buffers from each source device
    width_b: float  # the buffer panel's width
    x_a: float
    x_b: float
    x_c: float
    y_a: float
    y_b: float
    y_c: float

    @classmethod
    def of(cls, record: MoeTrace, narrow: bool) -> _Placement:
        n, t, e, c = (record.n_devices, record.tokens_per_device, record.n_experts,
                      record.capacity)
        gap = 0.25 if narrow else 0.5
        width_b = n * c + (n - 1) * gap
        label = 1.0 if narrow else 1.9  # room for the row names
        if narrow:
            unit, across = 0.35, label + max(t, width_b)
            x_a = x_b = x_c = label
            y_a, step = 3.9, max(n, e) + 4.2
            y_b, y_c = y_a + step, y_a + 2 * step
            bottom = y_c + n + 3.4
        else:
            unit, arrow = 0.265, 3.6
            x_a = label
            x_b = x_a + t + arrow + 0.9
            x_c = x_b + width_b + arrow
            across = x_c + t + 1.3
            y_a = y_b = y_c = 4.1
            bottom = y_a + max(n, e) + 2.6
        return cls(narrow, unit, across, bottom, gap, width_b, x_a, x_b, x_c,
                   y_a, y_b, y_c)

    @property
    def fig_w(self) -> float:
        return self.across * self.unit + 0.2

    @property
    def fig_h(self) -> float:
        return self.bottom * self.unit

    def frac(self, x: float, y: float) -> tuple[float, float]:
        """Cell units -> figure fraction."""
        return (x + 0.2 / self.unit) / (self.fig_w / self.unit), 1 - y / self.bottom


class _Sheet:
    """The axes and the drawing's vocabulary: cells, headings, row and
    column names, an expert's colour, text sizes for the column."""

    def __init__(self, ax, width: str, palette) -> None:
        self.ax, self.width, self.palette = ax, width, palette
        self.narrow = width == "narrow"
        self.cell_pt = self.pt(10.5) if not self.narrow else 8
        self.small = self.pt(10)

    def pt(self, points: float) -> float:
        return _figure.font_pt(self.width, points)

    def colour(self, j: int):
        r, g, b, _ = self.palette(j % 10)
        return (0.45 + 0.55 * r, 0.45 + 0.55 * g, 0.45 + 0.55 * b)

    def box(self, x, y, face, text, dropped=False) -> None:
        from matplotlib.patches import Rectangle

        if dropped:  # white, a dashed red frame inside the cell
            self.ax.add_patch(Rectangle((x + 0.05, y + 0.05), 0.9, 0.9,
                                        facecolor="white", edgecolor="#b00000", lw=1,
                                        linestyle=(0, (3, 2))))
        else:
            self.ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face,
                                        edgecolor="white", lw=1.5))
        self.ax.text(x + 0.5, y + 0.5, text, ha="center", va="center",
                     fontsize=self.cell_pt, color="#b00000" if dropped else "black")

    def heading(self, x, y, span, text) -> None:
        self.ax.text(x + span / 2, y - 0.95, text, ha="center", va="bottom",
                     fontsize=self.pt(11.5), weight="bold")

    def rows(self, x, y, names) -> None:
        for k, name in enumerate(names):
            self.ax.text(x - 0.15, y + k + 0.5, name, ha="right", va="center",
                         fontsize=self.small)

    def columns(self, x, y, count: int) -> None:
        for i in range(count):
            self.ax.text(x + i + 0.5, y - 0.12, str(i), ha="center", va="bottom",
                         fontsize=self.small, color="#555555")

    def devices(self, n: int) -> list[str]:
        return [f"d{d}" if self.narrow else f"device {d}" for d in range(n)]


def _dispatch_panel(sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """Each device's tokens, coloured by their expert."""
    n, t = record.n_devices, record.tokens_per_device
    x, y = place.x_a, place.y_a
    sheet.heading(x, y - 0.1, t, "dispatch: each token's expert")
    sheet.rows(x, y, sheet.devices(n))
    sheet.columns(x, y, t)
    for d in range(n):
        for i in range(t):
            j = int(record.expert[d, i])
            sheet.box(x + i, y + d, sheet.colour(j), str(j),
                      dropped=record.slot[d, i] == DROPPED)


def _buffer_panel(sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """Each expert's buffer: slot s of expert j from source device d holds
    token i."""
    from matplotlib.patches import Rectangle

    n, e, c = record.n_devices, record.n_experts, record.capacity
    x, y, gap = place.x_b, place.y_b, place.gap
    sheet.heading(x, y - 0.1, place.width_b, "each expert's buffer: token in slot")
    sheet.rows(x, y, [f"E{j}" for j in range(e)])
    buffers = record.buffers()
    for j in range(e):
        for d in range(n):
            x0 = x + d * (c + gap)
            for s in range(c):
                i = int(buffers[j, d, s])
                if i < 0:
                    sheet.ax.add_patch(Rectangle((x0 + s, y + j), 1, 1,
                                                 facecolor=EMPTY_FACE,
                                                 edgecolor="white", lw=1.5))
                else:
                    sheet.box(x0 + s, y + j, sheet.colour(j), str(i))
    for d in range(n):
        sheet.ax.text(x + d * (c + gap) + c / 2, y - 0.12, f"from d{d}", ha="center",
                      va="bottom", fontsize=sheet.small, color="#555555")


def _combine_panel(sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """What came back to each token's row: its expert, ``?`` for another
    token, 0 for a dropped one."""
    n, t = record.n_devices, record.tokens_per_device
    x, y = place.x_c, place.y_c
    sheet.heading(x, y - 0.1, t, "combine: back from expert")
    sheet.rows(x, y, sheet.devices(n) if sheet.narrow else [])
    sheet.columns(x, y, t)
    for d in range(n):
        for i in range(t):
            back = record.returned_token[d, i] != DROPPED
            j = int(record.returned_expert[d, i])
            home = back and record.returned_token[d, i] == record.home[d, i]
            sheet.box(x + i, y + d, sheet.colour(j), (str(j) if home else "?") if back
                      else "0", dropped=not back)


def _moves(sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """The two all-to-alls, as arrows between the panels."""
    from matplotlib.patches import FancyArrowPatch

    n, t, e = record.n_devices, record.tokens_per_device, record.n_experts
    ax = sheet.ax
    if place.narrow:
        moves = ("all-to-all (dispatch)", "expert FFN, then\nall-to-all (combine)")
        spans = ((place.y_a + n, place.y_b - 1.7), (place.y_b + e, place.y_c - 1.7))
        for (y0, y1), words in zip(spans, moves, strict=True):
            ax.add_patch(FancyArrowPatch((place.x_a + 0.8, y0 + 0.6),
                                         (place.x_a + 0.8, y1 - 0.1),
                                         arrowstyle="-|>", mutation_scale=16,
                                         lw=2, color="#333333"))
            ax.text(place.x_a + 1.5, (y0 + y1) / 2 + 0.25, words, ha="left",
                    va="center", fontsize=sheet.pt(10.5), linespacing=1.2)
    else:
        moves = ("all-to-all\n(dispatch)", "expert\nFFN, then\nall-to-all\n(combine)")
        mid = place.y_a + max(n, e) / 2
        spans = ((place.x_a + t, place.x_b - 0.9),
                 (place.x_b + place.width_b, place.x_c))
        for (x0, x1), words in zip(spans, moves, strict=True):
            ax.add_patch(FancyArrowPatch((x0 + 0.2, mid), (x1 - 0.2, mid),
                                         arrowstyle="-|>", mutation_scale=18,
                                         lw=2, color="#333333"))
            ax.text((x0 + x1) / 2, mid - 0.25, words, ha="center", va="bottom",
                    fontsize=sheet.pt(10.5), linespacing=1.2)


def _titles(sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """The title and the case above, the compiled layer's all-to-alls below."""
    n, t, e, c = (record.n_devices, record.tokens_per_device, record.n_experts,
                  record.capacity)
    ax, pt, across, bottom = sheet.ax, sheet.pt, place.across, place.bottom
    sent = (f"{record.all_to_alls} all-to-alls in the compiled layer, "
            f"{_bytes(record.all_to_all_bytes)} sent per device")
    kept = int(np.sum(record.kept))
    one_each = record.experts_per_device == 1
    if place.narrow:
        ax.text(-0.1, 0.25, f"Mixture of experts, {n} devices", ha="left",
                va="top", fontsize=9.5, weight="bold")
        ax.text(-0.1, 0.95, f"top-1: each of {t} tokens on devices d0\u2013d{n - 1} "
                f"goes to\none of {e} experts "
                f"({'expert j on dj' if one_each else f'{e // n} per device'}), "
                f"{c} slots per "
                f"device\nand expert: {kept} kept, {record.dropped} dropped",
                ha="left", va="top", fontsize=pt(7.5), color="#333333",
                linespacing=1.25)
        ax.text(-0.1, bottom - 0.25, sent.replace("layer, ", "layer,\n"),
                ha="left", va="bottom", fontsize=pt(10.5), color="#333333",
                linespacing=1.25)
    else:
        ax.text(across / 2, 0.3, f"Mixture of experts, top-1: {n} devices \u00d7 "
                f"{t} tokens, {e} experts ("
                f"{'expert j on device j' if one_each else f'{e // n} per device'})",
                ha="center",
                va="top", fontsize=pt(13), weight="bold")
        ax.text(across / 2, 1.35, f"{c} slots per (device, expert): {kept} tokens "
                f"kept, {record.dropped} dropped (their expert's slots were full)",
                ha="center", va="top", fontsize=pt(11), color="#333333")
        ax.text(across / 2, bottom - 0.25, sent, ha="center", va="bottom",
                fontsize=pt(10.5), color="#333333")


def _legend(fig, sheet: _Sheet, record: MoeTrace, place: _Placement) -> None:
    """One swatch per expert (and its device), and the dropped cell."""
    from matplotlib.patches import Patch

    n, e = record.n_devices, record.n_experts
    handles = [Patch(facecolor=sheet.colour(j), label=f"expert {j} (device "
                     f"{_device_of(record, j)})") for j in range(e)]
    handles.append(Patch(facecolor="white", edgecolor="#b00000", linestyle="--",
                         label="dropped: output 0"))
    narrow = place.narrow
    legend_y = place.y_c + n + 0.45 if narrow else place.y_a + max(n, e) + 0.35
    fig.legend(handles=handles, loc="upper left" if narrow else "upper center",
               ncol=2 if narrow else len(handles), fontsize=sheet.pt(10.5),
               frameon=False, borderaxespad=0, handlelength=1.2,
               columnspacing=1.0,
               bbox_to_anchor=place.frac(-0.1 if narrow else place.across / 2,
                                         legend_y))
