"""Collective accounting: which collectives a compiled program runs, and their cost.

:func:`collective_stats` compiles a function and reads its compiled HLO text:
for each collective kind it reports how many ops there are and how many bytes
each device sends, from the operand shapes, the replica groups and the cost
model below. Tests use it to pin the exact collectives every form emits, so a
change that adds one fails a test.

Cost model (bytes each device sends, bandwidth-optimal ring algorithms, ``n``
devices in the group, ``V`` the size in bytes of the whole logical array):

======================  ===========================  ==============================
kind                    ``V`` is                     bytes sent per device
======================  ===========================  ==============================
``all-reduce``          the buffer every device      ``2 (n-1)/n * V`` (a reduce-
                        holds (input = output)       scatter, then an all-gather)
``all-gather``          the gathered output          ``(n-1)/n * V``
``reduce-scatter``      the unscattered input        ``(n-1)/n * V``
``all-to-all``          the global array, ``n``      ``(n-1)/n**2 * V``: each device
                        per-device buffers           keeps 1/n of its buffer
``collective-permute``  the buffer one device sends  ``V``
======================  ===========================  ==============================

Sources: NVIDIA nccl-tests ``doc/PERFORMANCE.md`` (the algbw/busbw correction
factors ``2(n-1)/n``, ``(n-1)/n`` and, for all-to-all on its per-rank size,
``(n-1)/n``) and the sharding chapter of the JAX scaling book
(jax-ml/scaling-book ``sharding.md``: all-gather and reduce-scatter cost
``V/W * (n-1)/n``, all-reduce twice that, all-to-all a fraction of an
all-gather since each shard travels to one device only). These count bytes
leaving a device, not link hops: on a bidirectional ring the scaling book's
all-to-all figure (a quarter of an all-gather) also charges the hops that
relay a chunk.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import jax

from collectives._hlo_groups import parse_groups
from collectives._hlo_groups import spanned_axes

KINDS: tuple[str, ...] = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
"""The collective kinds counted, as XLA names their HLO opcodes."""


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' correction from algorithm to bus bandwidth for ``n`` devices.

    ``busbw = algbw * bus_factor`` where ``algbw = S / t`` and ``S`` is the size
    nccl-tests reports: the buffer for all-reduce, the whole array for
    all-gather and reduce-scatter, one device's buffer for all-to-all and
    permute.

    Examples:
      >>> from collectives.hlo import bus_factor
      >>> bus_factor("all-reduce", 8), bus_factor("all-gather", 8)
      (1.75, 0.875)
    """
    _check_kind(kind)
    if n < 1:
        raise ValueError(f"n: expected at least 1 device, got {n}.")
    if kind == "all-reduce":
        return 2 * (n - 1) / n
    if kind == "collective-permute":
        return 1.0
    return (n - 1) / n


def bytes_moved(kind: str, size: float, n: int) -> float:
    """Bytes each device sends in one collective, by the cost model above.

    Args:
      kind: one of :data:`KINDS`.
      size: ``V``, the size in bytes of the whole logical array (see the
        module docstring for what that is per kind).
      n: the number of devices in the group.

    Returns:
      The bytes one device sends.

    Examples:
      >>> from collectives.hlo import bytes_moved
      >>> bytes_moved("all-reduce", 1024, 8)
      1792.0
      >>> bytes_moved("all-to-all", 1024, 8)
      112.0
    """
    factor = bus_factor(kind, n)
    if kind == "all-to-all":
        return factor * size / n
    return factor * size


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op in a compiled program.

    Attributes:
      kind: one of :data:`KINDS` (async ``-start``/``-done`` pairs are one op).
      name: the instruction's name in the HLO text.
      group_size: devices per replica group (``n`` in the cost model); for
        a permute, the number of source-target pairs.
      operand_bytes: bytes each device passes in.
      size: ``V`` of the cost model, in bytes.
      bytes: bytes each device sends, ``bytes_moved(kind, size, group_size)``.
      groups: the device ids of each replica group (a permute's
        source-target pairs), however XLA writes them (ids, an iota, a
        mesh's axes); empty where the group is every device.
      axis_names: mesh axes the collective runs over, where a caller names
        them instead of giving groups; the HLO reader leaves it empty (the
        axis names XLA prints are its own, not the mesh's).
      dtype: the element type of its (first) operand, as HLO writes it
        (``"f32"``, ``"bf16"``, ``"s32"``).
      written: how the program writes it where that is not ``kind``'s own
        opcode, else empty: the TPU compiler writes a large gather as an
        all-reduce of a zero-padded buffer (each device's block in place,
        zeros elsewhere), which moves a gather's bytes and counts as one.
      phase: the pass of a training step that runs it, from the name JAX
        gives the op (its ``op_name`` metadata): ``"backward"`` where the
        op belongs to a VJP's transpose (JAX names those
        ``transpose(jvp(...))``), ``"forward"`` for any other named op,
        empty where the program names none.
    """

    kind: str
    name: str
    group_size: int
    operand_bytes: int
    size: int
    bytes: float
    groups: tuple[tuple[int, ...], ...] = dataclasses.field(default=(), repr=False)
    axis_names: tuple[str, ...] = ()
    dtype: str = ""
    written: str = ""
    phase: str = ""

    def mesh_axes(self, mesh: jax.sharding.Mesh) -> tuple[str, ...]:
        """The axes of ``mesh`` (the one the program was compiled for) that
        this collective runs over, in mesh order: those along which the
        devices of a group differ.

        Examples:
          >>> import jax, numpy as np
          >>> import collectives as cx
          >>> from collectives.hlo import collective_stats
          >>> mesh = cx.make_mesh((4, 2), ("data", "model"))
          >>> x = jax.ShapeDtypeStruct((16, 4), np.float32,
          ...     sharding=jax.sharding.NamedSharding(mesh, jax.P("data")))
          >>> f = jax.jit(lambda x: x.sum(0), out_shardings=
          ...     jax.sharding.NamedSharding(mesh, jax.P()))
          >>> [op.mesh_axes(mesh) for op in collective_stats(f, x).ops]
          [('data',)]
        """
        return spanned_axes(self.groups, self.axis_names, tuple(mesh.axis_names),
                            tuple(mesh.devices.shape))


@dataclasses.dataclass(frozen=True)
class CollectiveStats:
    """The collectives of one compiled program, with counts and bytes per kind.

    Attributes:
      ops: every collective op found, in program order.
      text: the compiled HLO text it was read from (not in the repr).
    """

    ops: tuple[Collective, ...]
    text: str = dataclasses.field(default="", repr=False, compare=False)

    def count(self, kind: str | None = None) -> int:
        """How many ops of ``kind`` (all collectives when ``None``); 0 if absent."""
        return len(self._of(kind))

    def bytes(self, kind: str | None = None) -> float:
        """Bytes each device sends in ops of ``kind`` (all when ``None``)."""
        return float(sum(op.bytes for op in self._of(kind)))

    def counts(self) -> dict[str, int]:
        """The count of every kind in :data:`KINDS`, zeros included."""
        return {kind: self.count(kind) for kind in KINDS}

    def nonzero(self) -> dict[str, int]:
        """The counts of the kinds present, e.g. ``{"all-reduce": 1}``."""
        return {kind: n for kind, n in self.counts().items() if n}

    def __str__(self) -> str:
        lines = [f"{'kind':<20} {'count':>5} {'bytes/device':>14}"]
        for kind in KINDS:
            lines.append(f"{kind:<20} {self.count(kind):>5} {self.bytes(kind):>14,.0f}")
        return "\n".join(lines)

    def _of(self, kind: str | None) -> tuple[Collective, ...]:
        if kind is None:
            return self.ops
        _check_kind(kind)
        return tuple(op for op in self.ops if op.kind == kind)


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What a compiled program must contain: a recipe's cost model for one form.

    Attributes:
      counts: the exact number of ops of each collective kind; kinds not named
        must be absent.
      bytes: for some kinds, the bytes each device sends in all ops of that
        kind together (:func:`bytes_moved`); kinds not named are not checked.

    Examples:
      >>> from collectives.hlo import Expectation, CollectiveStats
      >>> Expectation({"all-reduce": 1}).mismatch(CollectiveStats(ops=()))
      "expected {'all-reduce': 1}, compiled to {}"
    """

    counts: Mapping[str, int]
    bytes: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in (*self.counts, *self.bytes):
            _check_kind(kind)

    def mismatch(self, stats: CollectiveStats, rel: float = 1e-6) -> str | None:
        """``None`` when ``stats`` meets this expectation, else what differs."""
        want = {kind: n for kind, n in self.counts.items() if n}
        if stats.nonzero() != want:
            return f"expected {want}, compiled to {stats.nonzero()}"
        for kind, expected in self.bytes.items():
            got = stats.bytes(kind)
            if not math.isclose(got, expected, rel_tol=rel, abs_tol=1e-9):
                return (f"expected {expected:,.0f} bytes per device in {kind}, "
                        f"compiled to {got:,.0f}")
        return None


def collective_stats(fn: Callable[..., Any], *args: Any, **kwargs: Any
                     ) -> CollectiveStats:
    """Compile ``fn`` for ``args`` and count the collectives in the program.

    Args:
      fn: a jitted callable (``jax.jit``, ``jax.pmap`` or anything with
        ``.lower``); other callables are wrapped with ``jax.jit``.
      *args: example arguments (arrays, placed as the program expects them,
        or ``jax.ShapeDtypeStruct``).
      **kwargs: example keyword arguments, likewise.

    Returns:
      A :class:`CollectiveStats`; ``.count("all-reduce")`` etc.

    Examples:
      >>> import jax, numpy as np
      >>> import collectives as cx
      >>> from collectives.hlo import collective_stats
      >>> mesh = cx.make_mesh((8,), "i")
      >>> f = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
      ...                   in_specs=jax.P("i"), out_specs=jax.P())
      >>> stats = collective_stats(f, np.ones((8, 4), np.float32))
      >>> stats.count("all-reduce"), stats.count("all-gather")
      (1, 0)
      >>> stats.bytes("all-reduce")  # 2 * 7/8 * 16 bytes
      28.0
    """
    if not hasattr(fn, "lower"):
        if not callable(fn):
            raise TypeError(
                f"fn: expected a callable (e.g. a jax.jit function), got {fn!r}.")
        fn = jax.jit(fn)
    text = fn.lower(*args, **kwargs).compile().as_text()
    return parse_collectives(text)


# -- reading the HLO text ------------------------------------------------------

_BYTES_PER_ELEMENT: Mapping[str, float] = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0,
}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([^\]]*)\]")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_NAME = re.compile(r"%([\w.\-]+)\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _phase(attrs: str) -> str:
    """The pass an op's ``op_name`` metadata places it in (see
    :attr:`Collective.phase`)."""
    named = _OP_NAME.search(attrs)
    if not named:
        return ""
    return "backward" if "transpose(" in named.group(1) else "forward"
_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_REPLICAS = re.compile(r"\breplica_count=(\d+)")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(
            f"kind: expected one of {', '.join(KINDS)}, got {kind!r}. Fix: use "
            "XLA's opcode name, e.g. 'all-reduce' for lax.psum.")


def _closing(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] in "([{":
            depth += 1
        elif text[i] in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string, e.g. ``f32[8,3]{1,0}`` or a tuple of them.

    Examples:
      >>> from collectives.hlo import shape_bytes
      >>> shape_bytes("f32[8,3]{1,0}"), shape_bytes("(bf16[4], s8[2,2])")
      (96, 12)
    """
    total = 0.0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype not in _BYTES_PER_ELEMENT:
            if not dtype.startswith("f8") and not dtype.startswith("f4"):
                continue
            per = 1.0 if dtype.startswith("f8") else 0.5
        else:
            per = _BYTES_PER_ELEMENT[dtype]
        sizes = [int(d.lstrip("<=")) for d in dims.split(",") if d.strip()]
        total += per * math.prod(sizes)
    return int(total)


def _pair_count(attrs: str) -> int:
    start = attrs.find("source_target_pairs=")
    if start < 0:
        return 1
    start += len("source_target_pairs=")
    pairs = attrs[start:_closing(attrs, start)]
    return max(1, len(re.findall(r"\{\s*\d+\s*,\s*\d+\s*\}", pairs)))


def _kind(opcode: str) -> str | None:
    if opcode.endswith("-done"):
        return None
    base = opcode.removesuffix("-start")
    return base if base in KINDS else None


def _ref(operand: str) -> str:
    found = _NAME.search(operand)
    return found.group(1) if found else ""


def _padded_gather(operand: str, defs: Mapping[str, tuple[str, list[str]]],
                   shapes: Mapping[str, str], n: int, size: int) -> bool:
    """Whether an all-reduce's ``operand`` is a gather written as a sum: a
    buffer of zeros (a broadcast zero constant) with one block of about
    ``1/n`` of it updated in place (``dynamic-update-slice``), so the sum
    over ``n`` devices is their blocks side by side."""
    opcode, args = defs.get(_ref(operand), ("", []))
    while opcode in ("copy", "copy-done", "copy-start", "bitcast") and args:
        opcode, args = defs.get(_ref(args[0]), ("", []))  # moved, not changed
    if opcode != "dynamic-update-slice" or len(args) < 2:
        return False
    base, base_args = defs.get(_ref(args[0]), ("", []))
    if base != "broadcast" or not base_args:
        return False
    constant, literal = defs.get(_ref(base_args[0]), ("", []))
    if constant != "constant" or literal[:1] not in (["0"], ["-0"], ["0.0"]):
        return False
    block = shape_bytes(shapes.get(_ref(args[1]), ""))
    # the buffer may be padded past n blocks (the TPU's tiles)
    return 0 < block * n <= size < block * (n + 1)


def parse_collectives(text: str) -> CollectiveStats:
    r"""The collectives in compiled HLO text (what ``Compiled.as_text()`` gives).

    Every instruction whose opcode is a collective kind, or its async
    ``-start`` half, counts once; ``-done`` halves and the ``async-start``
    wrappers are skipped (the wrapped collective is counted where its
    computation is printed). Ops inside loop bodies count once. An
    all-reduce of a zero-padded buffer that stands for a gather (the TPU
    compiler's way on large slices) counts as the all-gather it is, with
    ``written`` saying so.

    Args:
      text: the HLO module text.

    Returns:
      A :class:`CollectiveStats`.

    Examples:
      >>> from collectives.hlo import parse_collectives
      >>> stats = parse_collectives(
      ...     "HloModule m, num_partitions=4\n"
      ...     "  %p = f32[256]{0} parameter(0)\n"
      ...     "  %s = f32[256]{0} all-reduce-start(%p), replica_groups={{0,1,2,3}}\n"
      ...     "  %d = f32[256]{0} all-reduce-done(%s)\n")
      >>> stats.counts()["all-reduce"], stats.bytes("all-reduce")
      (1, 1536.0)
    """
    match = _PARTITIONS.search(text) or _REPLICAS.search(text)
    devices = int(match.group(1)) if match else 1
    shapes: dict[str, str] = {}
    defs: dict[str, tuple[str, list[str]]] = {}
    ops = []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, rest = m.groups()
        end = _closing(rest, 0) if rest.startswith("(") else rest.find(" ")
        if end <= 0:
            continue
        shapes[name] = rest[:end]
        op = _OPCODE.match(rest, end)
        if not op:
            continue
        close = _closing(rest, op.end() - 1)
        operands = _split_top(rest[op.end():close - 1])
        defs[name] = (op.group(1), operands)
        kind = _kind(op.group(1))
        if kind is None:
            continue
        attrs = rest[close:]
        if kind == "collective-permute" and "slice_sizes=" in attrs:
            operands = operands[:1]  # in-place form: input, output, offsets
        sizes, dtype = [], ""
        for operand in operands:
            ref = _NAME.search(operand)
            inline = operand[:ref.start()] if ref else operand
            known = shapes.get(ref.group(1), "") if ref else ""
            shape = inline if _ARRAY.search(inline) else known
            sizes.append(shape_bytes(shape))
            element = _ARRAY.search(shape)
            dtype = dtype or (element.group(1) if element else "")
        in_bytes = sum(sizes)
        groups, axis_names = parse_groups(attrs)
        if kind == "collective-permute":
            n = _pair_count(attrs)
            size = in_bytes
        else:
            n = len(groups[0]) if groups else devices
            size = in_bytes * n if kind in ("all-gather", "all-to-all") else in_bytes
        common = {"name": name, "group_size": n, "groups": groups,
                  "axis_names": axis_names, "dtype": dtype, "phase": _phase(attrs)}
        if kind == "all-reduce":
            # the operands that are gathers written as sums (several, where
            # the compiler combined them): one gather, the rest one sum
            gathered = sum(b for operand, b in zip(operands, sizes, strict=True)
                           if _padded_gather(operand, defs, shapes, n, b))
            if gathered:
                many = "s" if len(operands) > 1 else ""
                ops.append(Collective(
                    kind="all-gather", operand_bytes=gathered, size=gathered,
                    bytes=bytes_moved("all-gather", gathered, n),
                    written=f"all-reduce of {'' if many else 'a '}zero-padded "
                            f"buffer{many}", **common))
                size = in_bytes = in_bytes - gathered
                if not in_bytes:
                    continue
        ops.append(Collective(kind=kind, operand_bytes=in_bytes, size=size,
                              bytes=bytes_moved(kind, size, n), **common))
    return CollectiveStats(ops=tuple(_sliced_sums(ops, defs, shapes)), text=text)


def _sliced_sums(ops: list[Collective], defs: Mapping[str, tuple[str, list[str]]],
                 shapes: Mapping[str, str]) -> list[Collective]:
    """Mark the all-reduces whose result is only sliced (a reduce-scatter
    the compiler wrote as an all-reduce and a slice: it still sends an
    all-reduce's bytes, and counts as one). A combined all-reduce counts
    as sliced when what is read otherwise is under 1 % of its bytes (a
    scalar loss summed along with the gradients)."""
    users: dict[str, set[str]] = {}
    for name, (opcode, args) in defs.items():
        for arg in args:
            # a combined all-reduce's parts are read through get-tuple-element
            users.setdefault(_ref(arg), set()).add(
                name if opcode == "get-tuple-element" else opcode)

    def unsliced(name: str, size: float, seen: frozenset[str] = frozenset()
                 ) -> float:
        """Bytes of ``name``'s result read by anything but a dynamic-slice
        (names repeat across computations: a name met again reads as used)."""
        readers = users.get(name, set())
        if not readers or name in seen:
            return size
        found = 0.0
        for user in readers:
            if user in defs:  # a get-tuple-element: one part
                found += unsliced(user, shape_bytes(shapes.get(user, "")),
                                  seen | {name})
            elif user != "dynamic-slice":
                return size
        return found

    return [dataclasses.replace(op, written="all-reduce, then only sliced (a "
                                "reduce-scatter at an all-reduce's bytes)")
            if op.kind == "all-reduce" and not op.written and op.operand_bytes
            and unsliced(op.name, op.operand_bytes) <= 0.01 * op.operand_bytes
            else op for op in ops]


_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->.*\{\s*$")
_CALLED = re.compile(r"\b(calls|to_apply|body|branch_computations)=\{?%([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{([\d,\s]*)\}")


def _dims(shape: str) -> list[int]:
    found = _ARRAY.search(shape)
    if not found or not found.group(2).strip():
        return []
    return [int(d) for d in re.findall(r"\d+", found.group(2))]


def matmul_flops(text: str) -> float | None:
    r"""The FLOPs of the matmuls in compiled HLO text: ``2 * out * K`` for
    each ``dot`` (``K`` its contracted size), wherever it sits (fused
    computations included), times the trips of the loops it runs in (a
    ``while`` with a known trip count). For a compiler that gives no cost
    analysis (XLA:GPU's compile without a GPU): the program's own matmuls,
    not a formula's; elementwise work is left out. ``None`` where the text
    has no dot.

    Examples:
      >>> from collectives.hlo import matmul_flops
      >>> matmul_flops(
      ...     "ENTRY %main (a: f32[8,16], b: f32[16,4]) -> f32[8,4] {\n"
      ...     "  %a = f32[8,16]{1,0} parameter(0)\n"
      ...     "  %b = f32[16,4]{1,0} parameter(1)\n"
      ...     "  ROOT %d = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, "
      ...     "rhs_contracting_dims={0}\n}\n")
      1024.0
    """
    program = _Matmuls(text)
    if not program.dots:
        return None
    return program.total(program.entry) if program.entry else sum(program.own.values())


class _Matmuls:
    """The matmul FLOPs of compiled HLO text, per computation and per
    instruction, in the order each computation lists its instructions (its
    schedule, in a scheduled module)."""

    def __init__(self, text: str):
        shapes: dict[str, str] = {}
        self.own: dict[str, float] = {}
        self.calls: dict[str, list[tuple[str, int]]] = {}
        # each computation's instructions: (name, opcode, first operand, the
        # instruction's own FLOPs, the computations it calls with their trips)
        self.order: dict[str, list[tuple[str, str, str, float,
                                         list[tuple[str, int]]]]] = {}
        self.entry, self.dots, current = "", 0, ""
        self._totals: dict[str, float] = {}
        for line in text.splitlines():
            header = _COMPUTATION.match(line)
            if header:
                current = header.group(2)
                self.entry = current if header.group(1) else self.entry
                self.own.setdefault(current, 0.0)
                self.calls.setdefault(current, [])
                self.order.setdefault(current, [])
                for param in _split_top(header.group(3)):
                    name, _, shape = param.partition(":")
                    shapes[name.strip().lstrip("%")] = shape.strip()
                continue
            m = _INSTRUCTION.match(line)
            if not m or not current:
                continue
            name, rest = m.groups()
            end = _closing(rest, 0) if rest.startswith("(") else rest.find(" ")
            if end <= 0:
                continue
            shapes[name] = rest[:end]
            op = _OPCODE.match(rest, end)
            if not op:
                continue
            close = _closing(rest, op.end() - 1)
            attrs = rest[close:]
            operands = _split_top(rest[op.end():close - 1])
            trips = _TRIPS.search(attrs)
            called = [(callee, int(trips.group(1)) if key == "body" and trips else 1)
                      for key, callee in _CALLED.findall(attrs)]
            self.calls[current] += called
            flops = 0.0
            if op.group(1) == "dot":
                lhs = _dims(shapes.get(_ref(operands[0]), "")) if operands else []
                contracted = _CONTRACTING.search(attrs)
                dims = re.findall(r"\d+", contracted.group(1)) if contracted else []
                k = math.prod(lhs[int(d)] for d in dims if int(d) < len(lhs))
                flops = 2.0 * math.prod(_dims(rest[:end])) * k
                self.own[current] += flops
                self.dots += 1
            first = _ref(operands[0]) if operands else ""
            self.order[current].append((name, op.group(1), first, flops, called))

    def total(self, computation: str) -> float:
        """The FLOPs of one run of ``computation``, its callees' included."""
        if computation not in self._totals:
            self._totals[computation] = 0.0  # (a cycle, which HLO has not, ends here)
            self._totals[computation] = self.own.get(computation, 0.0) + sum(
                times * self.total(callee)
                for callee, times in self.calls.get(computation, ()))
        return self._totals[computation]

    def instruction(self, flops: float, called: Sequence[tuple[str, int]]) -> float:
        return flops + sum(times * self.total(callee) for callee, times in called)


def scheduled_overlap(text: str) -> dict[str, float]:
    r"""For each asynchronous collective in compiled HLO text, the matmul
    FLOPs its computation's schedule runs between its start and its done:
    the work the compiler placed to hide it. Keyed by the name
    :func:`parse_collectives` gives the op (the ``-start`` instruction's, or
    for an ``async-start`` wrapper the wrapped collective's); a collective
    run synchronously (no start and done) is not in it. The text must be
    of a scheduled module (``Compiled.as_text()``), whose computations list
    their instructions in the order they run.

    Examples:
      >>> from collectives.hlo import scheduled_overlap
      >>> scheduled_overlap(
      ...     "HloModule m, is_scheduled=true\n"
      ...     "ENTRY %main (a: f32[8,16], b: f32[16,4]) -> f32[8,4] {\n"
      ...     "  %a = f32[8,16]{1,0} parameter(0)\n"
      ...     "  %b = f32[16,4]{1,0} parameter(1)\n"
      ...     "  %s = f32[16,4]{1,0} all-reduce-start(%b), replica_groups={{0,1}}\n"
      ...     "  %d = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, "
      ...     "rhs_contracting_dims={0}\n"
      ...     "  ROOT %e = f32[16,4]{1,0} all-reduce-done(%s)\n}\n")
      {'s': 1024.0}
    """
    program = _Matmuls(text)
    wrapped: dict[str, str] = {}  # a wrapped collective's computation -> its op
    for computation, instructions in program.order.items():
        for name, opcode, _, _, _ in instructions:
            if _kind(opcode) is not None and not opcode.endswith("-done"):
                wrapped.setdefault(computation, name)
    found: dict[str, float] = {}
    for instructions in program.order.values():
        open_at: dict[str, tuple[str, int]] = {}  # start -> (op name, position)
        for position, (name, opcode, first, _, called) in enumerate(instructions):
            if opcode == "async-start":
                inner = next((wrapped[c] for c, _ in called if c in wrapped), None)
                if inner is not None:
                    open_at[name] = (inner, position)
            elif opcode.endswith("-start") and _kind(opcode) is not None:
                open_at[name] = (name, position)
            elif opcode.endswith("-done") and first in open_at:
                op, begun = open_at.pop(first)
                between = instructions[begun + 1:position]
                found[op] = sum(program.instruction(flops, calls)
                                for _, _, _, flops, calls in between)
    return found
