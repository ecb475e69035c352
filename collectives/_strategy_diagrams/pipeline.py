"""The GPipe schedule of ``recipes/pipeline.py``, recorded from a real run.

:func:`trace` runs the file's ``pipeline_value_and_grad`` (forward and
``jax.grad``) under ``shard_map`` on a mesh of ``S`` stages, with the file's
``stage_layer`` wrapped in a tap passed as its ``layer`` argument. The tap is
the identity; its forward records, on the host, the activation each stage's
layer receives at each tick, and its backward (a ``custom_vjp``) the
cotangent that reaches it. Each record is a host callback whose result the
layer's input depends on, so each stage's records arrive in program order:
forward ticks ``0 .. T-1``, then the backward steps, ticks ``T-1 .. 0``.

Inputs are markers: weights ``(1 + s / 10) * I``, zero biases, microbatch ``m``'s rows
filled with ``0.1 * (m + 1)``. An activation is read as microbatch ``m``
when it equals microbatch ``m``'s activation after ``s`` layers in the
file's NumPy oracle (``forward_numpy``); zeros are no microbatch. A layer
call works for the model when the gradient reaching it is nonzero; in the
bubble a stage runs its layer on zeros (before the first microbatch arrives)
or on a repeat of the last one (after it has passed), and the zero gradient
shows the result is discarded.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from jax.sharding import PartitionSpec as P

from collectives import _figure
from collectives._devices import make_mesh
from collectives._strategy_diagrams import on_its_own_mesh
from collectives.recipes import pipeline as pipeline_file

CAPTION = (
    "The GPipe schedule of recipes/pipeline.py, recorded from a real training "
    "step on 8 devices, one stage each, with the batch in 4 microbatches: which "
    "microbatch each stage works on at each tick, forward (F) and backward (B), "
    "its activations passed on to the next stage with a ppermute. Hatched cells "
    "are the bubble, where a stage computes on zeros or a repeat whose result "
    "is thrown away.")

_AXIS = "stage"
_WIDTH = 2  # features per row
_ROWS = 2  # rows per microbatch
NONE, OTHER = -1, -2  # forward inputs: zeros; not any microbatch's activation


@dataclasses.dataclass(frozen=True)
class PipelineTrace:
    """What each stage did at each tick of one GPipe step.

    ``forward_input[s, t]``: the microbatch whose activation stage ``s``'s
    layer received at forward tick ``t`` (``NONE``: zeros, ``OTHER``: no
    microbatch's). ``forward_used[s, t]``: the gradient reaching that call
    was nonzero. ``backward[s, k]``: the microbatch whose gradient stage
    ``s`` computed at backward step ``k`` (tick ``T + k`` of the step, the
    transpose of forward tick ``T - 1 - k``), ``NONE`` if its gradient was
    zero. ``loss`` is the run's, ``loss_oracle`` the file's NumPy oracle's.
    """

    stages: int
    microbatches: int
    forward_input: np.ndarray
    forward_used: np.ndarray
    backward: np.ndarray
    loss: float
    loss_oracle: float

    @property
    def ticks(self) -> int:
        """``T``, the ticks of one pass (the scan's length)."""
        return self.forward_input.shape[1]

    @property
    def forward(self) -> np.ndarray:
        """``[S, T]``: the microbatch each stage works on, ``NONE`` in the bubble."""
        return np.where(self.forward_used, self.forward_input, NONE)

    @property
    def schedule(self) -> np.ndarray:
        """``[S, 2T]``: forward then backward ticks, microbatch or ``NONE``."""
        return np.concatenate([self.forward, self.backward], axis=1)

    @property
    def idle(self) -> np.ndarray:
        """``[S]``: idle ticks of each stage in one pass (forward; backward alike)."""
        return np.sum(self.forward < 0, axis=1)


def _tap(axis, forward_log, backward_log):
    """An identity whose forward and backward record on the host, in order."""
    lock = threading.Lock()

    def recorder(log):
        def record(stage, *values):
            with lock:
                log.setdefault(int(stage), []).append(
                    tuple(np.array(v) for v in values))
            return np.int32(0)
        return record

    def after(token, a):
        # a, once the callback has run: the layer's input depends on it
        return jnp.where(token == 0, a, jnp.zeros_like(a))

    def call(log, *values):
        return io_callback(recorder(log), jax.ShapeDtypeStruct((), np.int32),
                           lax.axis_index(axis), *values)

    @jax.custom_vjp
    def tap(a):
        return a

    def tap_fwd(a):
        a = after(call(forward_log, a), a)
        return a, a

    def tap_bwd(a, g):
        return (after(call(backward_log, a, g), g),)

    tap.defvjp(tap_fwd, tap_bwd)
    return tap


def _marker_inputs(stages: int, microbatches: int):
    # w[s] = (1 + s / 10) * I: each layer its own, so an activation that went
    # through the wrong layers is no microbatch's; zero biases keep zeros zero
    scale = (1 + 0.1 * np.arange(stages, dtype=np.float32))[:, None, None]
    params = {"w": scale * np.eye(_WIDTH, dtype=np.float32),
              "b": np.zeros((stages, _WIDTH), np.float32)}
    ids = np.repeat(np.arange(microbatches), _ROWS)
    x = np.repeat((0.1 * (ids + 1)).astype(np.float32)[:, None], _WIDTH, axis=1)
    return params, x, np.zeros_like(x)


def _which(activation, expected) -> int:
    """The microbatch whose activation ``activation`` is; NONE or OTHER."""
    if not np.any(activation):
        return NONE
    for m, want in enumerate(expected):
        if np.allclose(activation, want, rtol=1e-5, atol=1e-6):
            return m
    return OTHER


@on_its_own_mesh
def trace(stages: int = 8, microbatches: int = 4) -> PipelineTrace:
    """Run the file's ``pipeline_value_and_grad`` on ``stages`` devices and
    record the schedule (see the module docstring)."""
    mesh = make_mesh((stages,), _AXIS)
    forward_log: dict = {}
    backward_log: dict = {}
    tap = _tap(_AXIS, forward_log, backward_log)

    def layer(params, a):
        return pipeline_file.stage_layer(params, tap(a))

    body = functools.partial(pipeline_file.pipeline_value_and_grad, axis=_AXIS,
                             microbatches=microbatches, layer=layer)
    split = {"w": P(_AXIS), "b": P(_AXIS)}
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(split, P(), P()),
                                 out_specs=(P(), split)))
    params, x, y = _marker_inputs(stages, microbatches)
    loss, _ = step(params, x, y)
    jax.block_until_ready(loss)
    loss_oracle, _ = pipeline_file.pipeline_numpy(params, x, y)

    acts, _ = pipeline_file.forward_numpy(params, x)  # acts[s]: the input of layer s
    ticks = microbatches + stages - 1
    forward_input = np.full((stages, ticks), OTHER)
    forward_used = np.zeros((stages, ticks), bool)
    backward = np.full((stages, ticks), NONE)
    for s in range(stages):
        calls, grads = forward_log[s], backward_log[s]
        if len(calls) != ticks or len(grads) != ticks:
            raise RuntimeError(f"stage {s}: {len(calls)} forward and {len(grads)} "
                               f"backward layer calls, expected {ticks} each")
        expected = pipeline_file.split_microbatches(acts[s], microbatches)
        for t, ((a,), (residual, g)) in enumerate(zip(calls, grads[::-1],
                                                      strict=True)):
            if not np.array_equal(a, residual):
                raise RuntimeError(f"stage {s}: backward step {ticks - 1 - t} is not "
                                   f"the transpose of forward tick {t}")
            forward_input[s, t] = _which(a, expected)
            forward_used[s, t] = bool(np.any(g))
            backward[s, ticks - 1 - t] = (forward_input[s, t] if np.any(g)
                                          else NONE)
    return PipelineTrace(stages, microbatches, forward_input, forward_used,
                         backward, float(loss), float(loss_oracle))


def _title(record: PipelineTrace, narrow: bool = False) -> str:
    s, m, t = record.stages, record.microbatches, record.ticks
    idle = sorted(set(record.idle.tolist()))
    count = idle[0] if len(idle) == 1 else "/".join(map(str, idle))
    bubble = pipeline_file.bubble_fraction(s, m)
    title = (f"GPipe, {s} stages x {m} microbatches:\nbubble {count} of {t} ticks "
             f"per stage\nand pass ({bubble:.0%} idle)")
    return title if narrow else title.replace("\n", " ")


def _cell(value: int, backward: bool) -> str:
    return "." if value < 0 else f"{'B' if backward else 'F'}{value}"


def text(record: PipelineTrace) -> str:
    """The schedule as a plain-text table: a row per stage, a column per tick."""
    t = record.ticks
    bubble = pipeline_file.bubble_fraction(record.stages, record.microbatches)
    lines = [_title(record),
             f"bubble fraction (stages - 1) / (microbatches + stages - 1) = "
             f"{bubble:.2f}",
             f"F m / B m: forward / backward of microbatch m; '.': idle (bubble). "
             f"Ticks 0-{t - 1} forward, {t}-{2 * t - 1} backward.",
             "stage | " + " ".join(f"{k:>3}" for k in range(2 * t)) + " | idle"]
    for s in range(record.stages):
        cells = [_cell(v, k >= t) for k, v in enumerate(record.schedule[s])]
        idle = int(np.sum(record.schedule[s] < 0))
        lines.append(f"{s:>5} | " + " ".join(f"{c:>3}" for c in cells)
                     + f" | {idle}")
    return "\n".join(lines)


def draw(record: PipelineTrace, path, width: str = "wide") -> None:
    """Write the schedule as an SVG: ticks across and stages down (wide), or
    stages across and ticks down (narrow)."""
    import matplotlib  # optional: the docs extra

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    narrow = width == "narrow"
    fs = _figure.font_pt(width, 10.5)  # cells, ticks; 8.9 pt narrow
    if narrow:
        fig = Figure(figsize=(3.7, 2.0 + 0.205 * 2 * record.ticks))
        ax = fig.add_axes((0.2, 0.8 / fig.get_figheight(), 0.77,
                           1 - 1.95 / fig.get_figheight()))
    else:
        fig = Figure(figsize=(10, 1.5 + 0.42 * record.stages))
        ax = fig.add_axes((0.08, 0.2, 0.9, 0.68))
    palette = matplotlib.colormaps["tab10"]
    _schedule_cells(ax, record, narrow, fs, palette)
    _schedule_axes(ax, record, narrow, fs)
    _title_and_legend(fig, record, narrow, fs, palette)
    _figure.save(fig, path)


def _colour(palette, m: int, backward: bool):
    """Microbatch ``m``'s colour; its backward a shade darker."""
    r, g, b, _ = palette(m % 10)
    mix = 0.35 if backward else 0.6
    return (mix + r * (1 - mix), mix + g * (1 - mix), mix + b * (1 - mix))


def _schedule_cells(ax, record: PipelineTrace, narrow: bool, fs: float,
                    palette) -> None:
    """A cell per (stage, tick): the microbatch it works on, or idle."""
    from matplotlib.patches import Rectangle

    t = record.ticks

    def at(k: int, s: int) -> tuple[int, int]:
        """The cell of tick ``k``, stage ``s``: (x, y)."""
        return (s, k) if narrow else (k, s)

    for s in range(record.stages):
        for k in range(2 * t):
            m, backward = int(record.schedule[s, k]), k >= t
            if m < 0:
                ax.add_patch(Rectangle(at(k, s), 1, 1, facecolor="#eeeeee",
                                       edgecolor="white", hatch="///", lw=1))
                continue
            ax.add_patch(Rectangle(at(k, s), 1, 1,
                                   facecolor=_colour(palette, m, backward),
                                   edgecolor="white", lw=1))
            x, y = at(k, s)
            ax.text(x + 0.5, y + 0.5, _cell(m, backward), ha="center",
                    va="center", fontsize=fs)


def _schedule_axes(ax, record: PipelineTrace, narrow: bool, fs: float) -> None:
    """Ticks and stages on the axes, forward and backward apart."""
    s_count, t = record.stages, record.ticks
    ticks = (np.arange(2 * t) + 0.5, [str(k) for k in range(2 * t)])
    stages = (np.arange(s_count) + 0.5, [str(s) for s in range(s_count)])
    if narrow:
        ax.axhline(t, color="#333333", lw=1.5)
        for y, words in ((t / 2, "forward ticks"), (1.5 * t, "backward ticks")):
            ax.text(-1.4, y, words, rotation=90, ha="center", va="center",
                    fontsize=fs, weight="bold")
        ax.set_xlim(0, s_count)
        ax.set_ylim(2 * t, 0)
        ax.set_yticks(*ticks, fontsize=fs)
        ax.set_xticks(*stages, fontsize=fs)
        ax.xaxis.tick_top()
        ax.xaxis.set_label_position("top")
        ax.set_xlabel("stage (device)", fontsize=fs)
    else:
        ax.axvline(t, color="#333333", lw=2)
        ax.text(t / 2, -0.25, "forward", ha="center", va="bottom", fontsize=11,
                weight="bold")
        ax.text(1.5 * t, -0.25, "backward (gradients)", ha="center", va="bottom",
                fontsize=11, weight="bold")
        ax.set_xlim(0, 2 * t)
        ax.set_ylim(s_count, 0)
        ax.set_xticks(*ticks, fontsize=fs)
        ax.set_yticks(*stages, fontsize=11)
        ax.set_xlabel("tick", fontsize=11)
        ax.set_ylabel("stage (device)", fontsize=11)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def _title_and_legend(fig, record: PipelineTrace, narrow: bool, fs: float,
                      palette) -> None:
    """The title above; a swatch per microbatch and the bubble below."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=_colour(palette, m, False), label=f"microbatch {m}")
               for m in range(record.microbatches)]
    handles.append(Patch(facecolor="#eeeeee", hatch="///", edgecolor="#bbbbbb",
                         label="idle (bubble)"))
    if narrow:
        fig.text(0.5, 1 - 0.08 / fig.get_figheight(), _title(record, narrow=True),
                 ha="center", va="top", fontsize=fs + 0.5, weight="bold",
                 linespacing=1.2)
        fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=fs,
                   frameon=False, bbox_to_anchor=(0.5, 0.0), columnspacing=1.2,
                   handlelength=1.5)
    else:
        fig.suptitle(_title(record), fontsize=12, y=0.985)
        fig.legend(handles=handles, loc="lower center", ncol=len(handles),
                   fontsize=11, frameon=False, bbox_to_anchor=(0.5, 0.0))
