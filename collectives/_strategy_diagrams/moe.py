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
from collectives.recipes import moe as moe_file

CAPTION = (
    "Mixture-of-experts dispatch and combine of recipes/moe.py, recorded from a "
    "real run: the file's route and assign_slots give each token's expert and "
    "slot, and moe_body (all_to_all, expert FFN, all_to_all) on 4 devices x 8 "
    "marker tokens, 4 experts, capacity 2 returns each kept token, tagged by its "
    "expert, to its own row; dropped tokens come back as zeros, as in the oracle.")

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
        bool(np.allclose(out, want, rtol=1e-5, atol=1e-6)))


def _title(record: MoeTrace) -> str:
    total = record.expert.size
    return (f"MoE top-1: {record.n_devices} devices x {record.tokens_per_device} "
            f"tokens, {record.n_experts} experts, capacity {record.capacity} per "
            f"(source, expert): {record.dropped} of {total} dropped "
            f"(oracle {record.oracle_dropped})")


def _device_of(record: MoeTrace, expert: int) -> int:
    return expert // record.experts_per_device


def text(record: MoeTrace) -> str:
    """The routing, the expert buffers and the combine as plain-text tables."""
    t, e = record.tokens_per_device, record.n_experts
    lines = [_title(record), "",
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
    return "\n".join(lines)


def draw(record: MoeTrace, path, width: str = "wide") -> None:
    """Write dispatch, expert buffers and combine as an SVG: three panels."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.patches import Rectangle

    n, t, e, c = (record.n_devices, record.tokens_per_device, record.n_experts,
                  record.capacity)
    palette = matplotlib.colormaps["tab10"]

    def colour(j: int):
        r, g, b, _ = palette(j % 10)
        return (0.45 + 0.55 * r, 0.45 + 0.55 * g, 0.45 + 0.55 * b)

    gap, arrow, label = 0.25, 3.0, 1.2  # label: room for the buffers' row names
    width_b = n * c + (n - 1) * gap
    x_a, x_b = 0.0, t + arrow + label
    x_c = x_b + width_b + arrow
    total = x_c + t
    rows = max(n, e)
    fig = Figure(figsize=(10, 3.8))
    ax = fig.add_axes((0.055, 0.12, 0.94, 0.76))
    ax.set_xlim(-0.2, total + 0.2)
    ax.set_ylim(rows + 0.2, -1.25)
    ax.axis("off")

    def box(x, y, face, text, crossed=False):
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor="white",
                               lw=1.5))
        ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=11,
                color="#b00000" if crossed else "black")
        if crossed:
            ax.plot([x + 0.15, x + 0.85], [y + 0.85, y + 0.15], color="#b00000",
                    lw=1.5)

    def heading(x, width, text):
        ax.text(x + width / 2, -1.0, text, ha="center", va="bottom", fontsize=11,
                weight="bold")

    # dispatch: each device's tokens, coloured by their expert
    heading(x_a, t, "dispatch: each token's expert")
    for d in range(n):
        ax.text(x_a - 0.15, d + 0.5, f"d{d}", ha="right", va="center", fontsize=11)
        for i in range(t):
            j = int(record.expert[d, i])
            kept = record.slot[d, i] != DROPPED
            box(x_a + i, d, colour(j) if kept else DROPPED_FACE, str(j),
                crossed=not kept)
    for i in range(t):
        ax.text(x_a + i + 0.5, -0.15, str(i), ha="center", va="bottom",
                fontsize=10, color="#555555")

    # expert buffers: slot c of expert j from source device d holds token i
    heading(x_b, width_b, "expert buffers: token in slot")
    buffers = record.buffers()
    for j in range(e):
        ax.text(x_b - 0.15, j + 0.5, f"E{j}", ha="right", va="center",
                fontsize=11)
        for d in range(n):
            x0 = x_b + d * (c + gap)
            for s in range(c):
                i = int(buffers[j, d, s])
                box(x0 + s, j, colour(j) if i >= 0 else EMPTY_FACE,
                    "" if i < 0 else str(i))
    for d in range(n):
        ax.text(x_b + d * (c + gap) + c / 2, -0.15, f"from d{d}", ha="center",
                va="bottom", fontsize=10, color="#555555")

    # combine: what came back to each token's row
    heading(x_c, t, "combine: home, via expert")
    for d in range(n):
        for i in range(t):
            back = record.returned_token[d, i] != DROPPED
            j = int(record.returned_expert[d, i])
            home = back and record.returned_token[d, i] == record.home[d, i]
            text = (str(j) if home else "?") if back else "0"
            box(x_c + i, d, colour(j) if back else DROPPED_FACE, text,
                crossed=not back)
    for i in range(t):
        ax.text(x_c + i + 0.5, -0.15, str(i), ha="center", va="bottom",
                fontsize=10, color="#555555")

    for x0, x1, what in ((x_a + t, x_b - label, "all_to_all\n(dispatch)"),
                         (x_b + width_b, x_c, "FFN, then\nall_to_all\n(combine)")):
        mid = rows / 2
        ax.annotate("", xy=(x1 - 0.2, mid), xytext=(x0 + 0.2, mid),
                    arrowprops=dict(arrowstyle="-|>", lw=2, color="#333333"))
        ax.text((x0 + x1) / 2, mid - 0.2, what, ha="center", va="bottom",
                fontsize=10.5)

    fig.suptitle(_title(record), fontsize=12, y=0.985)
    handles = [Patch(facecolor=colour(j), label=f"expert {j} (device "
                     f"{_device_of(record, j)})") for j in range(e)]
    handles.append(Patch(facecolor=DROPPED_FACE, edgecolor="#b00000",
                         label="dropped: output 0"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles),
               fontsize=10.5, frameon=False, bbox_to_anchor=(0.5, 0.0),
               handlelength=1.2, columnspacing=1.0)
    _figure.save(fig, path)
