"""The one place that knows how JAX versions differ.

Supported span: JAX 0.8.0 to the newest release. Every other module asks this
one instead of testing ``hasattr(jax, ...)`` or comparing versions itself.

What differs across that span, and what each name here papers over:

* ``jax.make_mesh`` creates ``Auto`` axes up to 0.8 and ``Explicit`` axes from
    0.9; :func:`auto_axis_types` gives the ``axis_types`` argument that yields
    ``Auto`` on every version.
* Marking a value as varying over an axis: ``lax.pcast(x, axis,
    to="varying")`` from 0.8.2; ``lax.pvary`` up to 0.9.2 (removed in 0.10.0)
    (:func:`pvary`).
* The invariant all-gather: ``lax.all_gather_invariant`` is public in 0.8.0
    and 0.8.1 only, private (``jax._src.lax.parallel``) from 0.8.2 to 0.9.2;
    ``lax.all_gather(..., to="invarying")`` from 0.10.0
    (:func:`all_gather_invariant`).
* The axes a value varies over: ``jax.typeof(x).vma`` up to 0.9.2,
    ``jax.typeof(x).mat.varying`` from 0.10.0 (:func:`vma`).
* How a jaxpr spells its control flow: ``scan`` says how its operands split
    into constants, carry and scanned inputs with ``num_consts``/``num_carry``
    up to 0.10 and with ``ft_in``/``ft_out`` flat trees from 0.11
    (:func:`scan_operands`, :func:`scan_carry_count`; the other control-flow
    and mapping equations through :func:`while_operands`,
    :func:`cond_branches`, :func:`shard_map_body`, :func:`pmap_body`).
* Parameters typed ``reduced`` over an axis get ``unreduced`` gradients
    (the sum over the axis deferred to a ``reshard``): checked from 0.10.2
    (:data:`UNREDUCED_GRADIENTS_CHECKED`).
* Bugs of single releases, with the recipe's workaround
    (``guides/sharp_edges_versions.py``): :data:`VMAP_OF_SHARD_MAP_PSUM_FAILS`
    (0.8.1 to 0.8.3), :data:`PSUM_SCATTER_ACCEPTS_NEGATIVE_DIMENSION` (0.11+);
    of Explicit axes' unreduced values (``guides/sharp_edges_explicit.py``):
    :data:`UNREDUCED_RESHARD_SCALES_BY_N` (0.8.0, 0.8.1),
    :data:`UNREDUCED_OUTPUT_READS_ONE_DEVICE` (up to 0.10.0); of shard_map
    manual over part of an Explicit mesh:
    :data:`PARTIAL_MANUAL_GATHERS_FREE_AXES` (0.10.1 to 0.11.1).

Every boundary below is checked against the release matrix
(``tools/jax_matrix.py``, ``docs/compat/results/``) by
``tests/test_compat_results.py``: :data:`PROBE_BOUNDARIES` says, for each
probe of ``tools/jax_probes.py`` that a name here depends on, the releases
where it holds.
* Whether JAX's backends have started (:func:`backends_initialized`).
* Behaviour the sharp-edge tests branch on: shard_map's input check on
    explicit meshes (:data:`SHARD_MAP_CHECKS_EXPLICIT_INPUT_SPECS`) and
    ppermute's axis-order check (:data:`PPERMUTE_CHECKS_AXIS_ORDER`,
    :func:`ppermute_axis_order_unchecked`).
* The multi-process runtime: ``jax.distributed.initialize`` takes
    ``shutdown_timeout_seconds`` from 0.8.1 only (:func:`initialize_distributed`);
    which cluster JAX detects depends on the version (:func:`detect_cluster`;
    Open MPI 5 from 0.11.2, through mpi4py); the coordination service's
    key-value store (:func:`key_value_set`, :func:`key_value_get`);
    XLA:CPU has ``--xla_cpu_collective_timeout_seconds`` from 0.10 only
    (:func:`cpu_collective_timeout_flags`); gloo listens on the host name's
    address unless told otherwise (:func:`use_loopback_gloo`).
* Pallas's TPU interpret mode, which runs the kernel recipes on CPU devices:
    they need 0.10.2 (:data:`HAS_INTERPRET_KERNELS`: the first release whose
    interpreter stops every device when one fails, rather than leaving the
    others waiting forever). It has no public way to read its race report or
    to stop a kernel that waits forever: :func:`interpret_races_found` and
    :func:`stop_interpreted_kernels` reach into its private module, here only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import re
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import jax
from jax import lax
from jax._src import clusters as _clusters
from jax._src import distributed as _distributed
from jax._src import mesh as _mesh_lib  # no public name for the mesh in context
from jax._src import xla_bridge as _xla_bridge
from jax._src.lib import _jax as _jaxlib


def _parse_version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        match = re.match(r"\d+", piece)
        parts.append(int(match.group()) if match else 0)
    return tuple(parts)


JAX_VERSION: tuple[int, ...] = _parse_version(jax.__version__)
"""The running JAX version as a tuple of ints, e.g. ``(0, 10, 2)``."""

OLDEST_SUPPORTED_JAX = (0, 8, 0)

MAKE_MESH_DEFAULTS_TO_EXPLICIT = JAX_VERSION >= (0, 9, 0)
"""``jax.make_mesh`` without ``axis_types`` gives Explicit axes from JAX 0.9."""

MAKE_MESH_WARNS_ABOUT_DEFAULT = (0, 8, 1) <= JAX_VERSION < (0, 9, 0)
"""``jax.make_mesh`` without ``axis_types`` raises a DeprecationWarning ("The
default axis_types will change in JAX v0.9.0") on 0.8.1 to 0.8.3 (an error
under ``-W error``); 0.8.0 and 0.9+ are silent. Pass ``axis_types``."""

NESTED_PMAP_SUPPORTED = False
"""Nested ``jax.pmap`` raises on every supported JAX (pmap runs on shard_map
since 0.8: "The context mesh ... should match the mesh passed to shard_map")."""

SHARD_MAP_CHECKS_EXPLICIT_INPUT_SPECS = JAX_VERSION >= (0, 9, 1)
"""On a mesh with ``Explicit`` axes, ``shard_map`` raises when an input's
sharding differs from ``in_specs`` ("in_specs passed to shard_map: ... does
not match the specs of the input") from JAX 0.9.1; 0.8.0 to 0.9.0.1 accept
and reshard (the matrix probe ``shard_map_checks_explicit_input_specs``)."""

PPERMUTE_CHECKS_AXIS_ORDER = JAX_VERSION >= (0, 11, 1)
"""``lax.ppermute`` over a tuple of axes not in mesh order raises a
RuntimeError from 0.11.1 (the ``jax_raise_on_ppermute_sort_diff`` flag; with
it off, devices are numbered in the tuple's order); up to 0.11.0 it silently
numbers devices in mesh order (the matrix probe ``ppermute_checks_axis_order``)."""

PCAST_VARYING_SINCE = (0, 8, 2)
"""``lax.pcast(x, axis, to="varying")`` exists from JAX 0.8.2."""

PVARY_REMOVED_IN = (0, 10, 0)
"""``lax.pvary`` exists up to 0.9.2 and is gone from JAX 0.10.0."""

ALL_GATHER_INVARIANT_PRIVATE_FROM = (0, 8, 2)
"""``lax.all_gather_invariant`` is public in JAX 0.8.0 and 0.8.1 only."""

ALL_GATHER_TO_INVARYING_SINCE = (0, 10, 0)
"""``lax.all_gather(..., to="invarying")`` exists from JAX 0.10.0; 0.8.2 to
0.9.2 have neither it ("Allowed `to` values are: {'reduced', 'varying'}") nor
the public ``lax.all_gather_invariant``, only the private one."""

HAS_PCAST_VARYING = JAX_VERSION >= PCAST_VARYING_SINCE
HAS_PVARY = JAX_VERSION < PVARY_REMOVED_IN
HAS_PUBLIC_ALL_GATHER_INVARIANT = JAX_VERSION < ALL_GATHER_INVARIANT_PRIVATE_FROM
HAS_ALL_GATHER_TO_INVARYING = JAX_VERSION >= ALL_GATHER_TO_INVARYING_SINCE

VMAP_OF_SHARD_MAP_PSUM_BROKEN_IN = frozenset({(0, 8, 1), (0, 8, 2), (0, 8, 3)})
"""The releases where ``jax.vmap`` of a shard_map'd ``lax.psum`` (or
``pmean``) under ``check_vma=True`` raises ``TypeError:
_psum_invariant_abstract_eval() got an unexpected keyword argument
'axis_index_groups'`` (jax-ml/jax#34249; reported for 0.8.1, the matrix finds
it in every 0.8.x after 0.8.0). Workaround: ``check_vma=False`` on that
shard_map, or the jit form."""

VMAP_OF_SHARD_MAP_PSUM_FAILS = JAX_VERSION in VMAP_OF_SHARD_MAP_PSUM_BROKEN_IN

PSUM_SCATTER_ACCEPTS_NEGATIVE_DIMENSION = JAX_VERSION >= (0, 11, 0)
"""``lax.psum_scatter(..., scatter_dimension=-1)`` compiles from JAX 0.11.0;
before, lowering fails ("'scatter_dimension' failed to satisfy constraint:
... non-negative", jax-ml/jax#20125). Workaround: ``dimension % ndim``."""

UNREDUCED_GRADIENTS_CHECKED_SINCE = (0, 9, 1)
"""The oldest release on which a parameter resharded to
``P(..., reduced={axis})`` gets an ``unreduced={axis}`` gradient that one
``reshard(g, P())`` sums (``recipes/dp_grads.py``'s deferred sum over
microbatches, ``DEFERRED_SUM_SINCE`` there): measured on 0.8.0, 0.8.3 and
0.9.0 ("operand passed to reduce_sum cannot be unreduced"), 0.9.1, 0.9.2,
0.10.2, 0.11.2 and 0.12.0.1 (right)."""

UNREDUCED_GRADIENTS_CHECKED = JAX_VERSION >= UNREDUCED_GRADIENTS_CHECKED_SINCE

EXPLICIT_KEYS_RESHARD_SINCE = (0, 10, 0)
"""From this release, a PRNG key array made inside jit on Explicit mesh axes
can be resharded (``recipes/monte_carlo.py``'s explicit form, its
``EXPLICIT_KEYS_SINCE``); before, ``reshard`` raises "Resource axis: i of
PartitionSpec('i', ...) is not found in mesh: ()". Measured: 0.8.0, 0.8.3,
0.9.2 raise; 0.10.2, 0.12.0.1 reshard."""

EXPLICIT_KEYS_RESHARD = JAX_VERSION >= EXPLICIT_KEYS_RESHARD_SINCE

UNREDUCED_RESHARD_SCALES_BY_N = JAX_VERSION in {(0, 8, 0), (0, 8, 1)}
"""On JAX 0.8.0 and 0.8.1, ``jax.sharding.reshard(x, P(unreduced={"i"}))``
on an Explicit mesh copies all of ``x`` to every device (its value becomes
``n * x``), so resharding it on to ``P()`` returns ``n * x``, silently; from
0.8.2 each device holds its own block and zeros (the sum is ``x``). Measured
on 0.8.0 to 0.8.3, 0.9.0, 0.9.1, 0.9.2, 0.10.2, 0.12.0.1 (pitfall 17 of
``guides/sharp_edges_explicit.py``). Workaround: reshard to ``P()``
directly; take partial sums from the op that makes them."""

UNREDUCED_OUTPUT_READS_ONE_DEVICE = JAX_VERSION < (0, 10, 1)
"""An unreduced array returned from jit (spec ``P(..., unreduced={"i"})``)
reads on the host as device 0's partial sum, silently, up to JAX 0.10.0;
from 0.10.1 reading it raises (``NotImplementedError: device_indices_map
doesn't work with unreduced``; 0.12.0.1: ``JaxRuntimeError: ... Unreduced
sharding does not support UniqueIndexDomains``; 0.12.1: ``RuntimeError:
Fetching value for `jax.Array` that is unreduced is not allowed``). Measured
on 0.8.0 to 0.10.2, 0.11.2, 0.12.0.1, 0.12.1 (pitfall 18). Fix: reshard to
``P()`` inside jit."""

UNREDUCED_SUM_PER_AXIS = JAX_VERSION >= (0, 12, 1)
"""From JAX 0.12.1, a ``reshard`` to ``P()`` of a value unreduced over
several mesh axes (``P(..., unreduced={"i", "j"})``, a gradient whose sum
over a data axis pair is deferred) sums it one axis at a time: an all-reduce
over ``"j"`` (2 devices), then one over ``"i"`` (4) on a ``(4, 2)`` mesh,
never combined with another value's (a loss beside it gets its own). The
values are the same; a device sends 2.5 times the value's bytes where one
all-reduce over the 8 devices sends 1.75 times (ring). Measured on 0.10.2,
0.12.0.1 (one all-reduce) and 0.12.1 (one per axis): ``dp_grads``,
``dp_adam`` and ``fsdp_mlp``'s explicit forms, their cost models
(:func:`collectives._costs.unreduced_sum`), pitfall 21 of
``guides/sharp_edges_explicit.py``. Workaround: sum it in a shard_map,
``jax.shard_map(lambda g: lax.psum(g, ("i", "j")), in_specs=P(unreduced=
{"i", "j"}), out_specs=P())``: one all-reduce on 0.12.1."""

CACHED_PROGRAM_HANGS_ACROSS_PROCESSES = JAX_VERSION >= (0, 12, 1)
"""From JAX 0.12.1, a multi-process CPU job (gloo collectives) whose rank 0
reads a program back from the persistent compilation cache
(``JAX_COMPILATION_CACHE_DIR``) waits forever in that program's first
collective: the first run of a job (every rank compiles, rank 0 writes the
entry) passes, the second hangs. Measured with two ranks of 4 CPU devices, a
shard_map ``psum`` over 8: rank 0 reading the entry with rank 1 compiling
hangs, rank 1 reading it with rank 0 compiling passes; 0.10.2 and 0.12.0.1
pass every way. The cause, read from jaxlib's launch log
(``TF_CPP_VMODULE=py_executable=1``): a program read back from the cache has
another fingerprint than the same program compiled, and each launch's ID is
counted from the fingerprint, so rank 0 launches with one ID and rank 1 with
another; 0.12.1's CPU collectives match the ranks of a collective by that ID
(0.12.0.1 shows the same two IDs and passes). ``distributed`` joins such a
job with the cache off."""

PARTIAL_MANUAL_GATHERS_FREE_AXES = (0, 10, 1) <= JAX_VERSION < (0, 11, 2)
"""A shard_map manual over some axes of an Explicit mesh (``axis_names={"X"}``
on a ``("X", "Y")`` mesh) whose input is sharded over a free axis too
(``f32[8@X, 8@Y]``) all-gathers that free axis before the body, so its
collectives carry the whole of it (twice the bytes of the all-reduce here);
other releases keep the free axis sharded. Measured on every release 0.8.0
to 0.12.0.1: 0.10.1, 0.10.2, 0.11.0, 0.11.1 gather (pitfall 19 of
``guides/sharp_edges_explicit.py``). Fix: a shard_map manual over every
axis the input is sharded on."""

AVAL_VARYING_IN_MAT = JAX_VERSION >= (0, 10, 0)
"""``jax.typeof(x).mat.varying`` replaces ``jax.typeof(x).vma`` (the axes a
value varies over inside shard_map)."""

PROBE_BOUNDARIES: dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]] = {
    "lax_pcast_varying": (PCAST_VARYING_SINCE, None),
    "lax_pvary": (OLDEST_SUPPORTED_JAX, PVARY_REMOVED_IN),
    "lax_all_gather_invariant": (OLDEST_SUPPORTED_JAX,
                                 ALL_GATHER_INVARIANT_PRIVATE_FROM),
    "all_gather_to_invarying": (ALL_GATHER_TO_INVARYING_SINCE, None),
    "private_all_gather_invariant": (OLDEST_SUPPORTED_JAX, (0, 12, 0)),
    "make_mesh_default_explicit": ((0, 9, 0), None),
    "make_mesh_warns_about_default": ((0, 8, 1), (0, 9, 0)),
    "psum_scatter_negative_dimension": ((0, 11, 0), None),
    "vmap_of_shard_map_psum": (OLDEST_SUPPORTED_JAX, None),
    "ppermute_checks_axis_order": ((0, 11, 1), None),
    "shard_map_checks_explicit_input_specs": ((0, 9, 1), None),
    "aval_vma": (OLDEST_SUPPORTED_JAX, (0, 10, 0)),
    "aval_mat_varying": ((0, 10, 0), None),
    "device_put_sharded": (OLDEST_SUPPORTED_JAX, (0, 10, 0)),
}
"""Probe of ``tools/jax_probes.py`` -> ``(since, gone_in)``: the probe holds on
releases ``since <= version < gone_in`` (``None``: up to the newest), except
those in :data:`PROBE_EXCEPTIONS`; the matrix results must agree."""

PROBE_EXCEPTIONS: dict[str, frozenset[tuple[int, ...]]] = {
    "vmap_of_shard_map_psum": VMAP_OF_SHARD_MAP_PSUM_BROKEN_IN,
}
"""Releases inside a probe's span where it does not hold (single-release bugs)."""


def auto_axis_types(ndim: int) -> tuple[Any, ...]:
    """The ``axis_types`` argument that makes every mesh axis ``Auto``."""
    return (jax.sharding.AxisType.Auto,) * ndim


def explicit_axis_types(ndim: int) -> tuple[Any, ...]:
    """The ``axis_types`` argument that makes every mesh axis ``Explicit``."""
    return (jax.sharding.AxisType.Explicit,) * ndim


def with_axis_types(mesh: jax.sharding.Mesh, explicit: bool) -> jax.sharding.Mesh:
    """``mesh`` (same devices, same order, same names) with every axis
    ``Explicit`` (``explicit=True``) or ``Auto``; ``mesh`` itself where it
    has those types already."""
    types = (explicit_axis_types if explicit else auto_axis_types)(len(mesh.shape))
    if tuple(mesh.axis_types) == types:
        return mesh
    return jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=types)


def tracing() -> bool:
    """Whether JAX is tracing now (inside a caller's ``jax.jit``): the mesh
    in scope is then the caller's, and ``jax.set_mesh`` may not be used."""
    from jax._src import core as _core  # no public name on any release

    return not _core.trace_state_clean()


def on_mesh(fn: Any, mesh: jax.sharding.Mesh | None, *,
            reads_context_mesh: bool = False) -> Callable[..., Any]:
    """``fn`` (jitted or pmapped), traced and run with ``mesh`` in scope
    (``None``: no mesh, as ``jax.pmap`` needs), so a mesh the caller set
    globally with ``jax.set_mesh`` does not reach it; inside a caller's
    ``jax.jit`` it runs under the caller's mesh. ``.lower`` lowers it so.

    A scope is entered only where the caller's differs from the one the
    program needs: entering and leaving one changes JAX's context, and the
    next dispatch of any jitted program pays for the change (some 20 us, near
    a tenth of a small program's call on simulated CPU devices). A program
    that names its mesh itself (``shard_map``'s ``mesh=``, ``NamedSharding``
    in/out, pmap's devices) traces the same with no mesh in context as with
    its own, so there it is called as it is, as the bare primitive is;
    ``reads_context_mesh=True`` marks a program that takes its mesh from the
    context (a ``reshard`` to a bare ``PartitionSpec``), which always runs
    with ``mesh`` in scope. That check is all a call adds to ``fn``'s: two
    reads of JAX's context in a plain function (a method, one more call, or
    forwarding an empty ``**kwargs`` to ``fn`` costs as much again).
    """
    abstract_now = _mesh_lib.get_abstract_mesh  # closure cells: the fewest lookups
    concrete_now = _mesh_lib.get_concrete_mesh
    no_abstract = _mesh_lib.empty_abstract_mesh  # JAX keeps one of each
    no_concrete = _mesh_lib.empty_concrete_mesh
    empty_suffices = mesh is None or not reads_context_mesh

    def call(*args: Any, **kwargs: Any) -> Any:
        if (empty_suffices and abstract_now() is no_abstract
                and concrete_now() is no_concrete):
            # without an empty ``**{}``, which takes JAX's slower keyword call
            return fn(*args, **kwargs) if kwargs else fn(*args)
        if tracing() or context_mesh_is(mesh):
            return fn(*args, **kwargs)
        with mesh_scope(mesh):
            return fn(*args, **kwargs)

    def lower(*args: Any, **kwargs: Any) -> Any:
        if (empty_suffices and context_mesh_is(None)) or tracing() or (
                context_mesh_is(mesh)):
            return fn.lower(*args, **kwargs)
        with mesh_scope(mesh):
            return fn.lower(*args, **kwargs)

    # names and docstring only: copying fn's __dict__ (updated=) would put
    # pmap's own ``lower`` on the wrapper, over the scoped one
    functools.update_wrapper(call, fn, updated=())
    call.lower = lower
    return call


def context_mesh_is(mesh: jax.sharding.Mesh | None) -> bool:
    """Whether the mesh in context (``jax.set_mesh``) is ``mesh``, abstract
    and concrete; ``None``: whether there is none (an empty one)."""
    abstract, concrete = _mesh_lib.get_abstract_mesh(), _mesh_lib.get_concrete_mesh()
    if mesh is None:
        return abstract.empty and concrete.empty
    return abstract == mesh.abstract_mesh and concrete == mesh


def mesh_scope(mesh: jax.sharding.Mesh | None) -> Any:
    """A context in which ``mesh`` is the mesh JAX traces against (``with
    jax.set_mesh(mesh):``): it stands in for whatever mesh a caller set
    globally, so a form runs on its own mesh's axis types. ``None``: no mesh
    at all, as ``jax.pmap`` needs (it builds its own; JAX 0.8 refuses
    ``set_mesh(None)``, so this passes JAX's empty mesh)."""
    return jax.set_mesh(_mesh_lib.empty_concrete_mesh if mesh is None else mesh)


def pvary(x: Any, axis_name: str | tuple[str, ...]) -> Any:
    """Mark ``x`` (an invariant value) as varying over ``axis_name``."""
    if HAS_PCAST_VARYING:
        return lax.pcast(x, axis_name, to="varying")
    return lax.pvary(x, axis_name)  # JAX 0.8.0 and 0.8.1


def all_gather_invariant(
        x: Any, axis_name: str | tuple[str, ...], *, axis: int = 0, tiled: bool = False
) -> Any:
    """All-gather whose result is typed invariant over ``axis_name``."""
    if HAS_PUBLIC_ALL_GATHER_INVARIANT:  # JAX 0.8.0 and 0.8.1
        return lax.all_gather_invariant(x, axis_name, axis=axis, tiled=tiled)
    if not HAS_ALL_GATHER_TO_INVARYING:  # JAX 0.8.2 to 0.9.2: private only
        # private, and only here on these versions: newer JAX may drop it
        from jax._src.lax import parallel as _parallel

        return _parallel.all_gather_invariant(x, axis_name, axis=axis, tiled=tiled)
    return lax.all_gather(x, axis_name, axis=axis, tiled=tiled, to="invarying")


def backends_initialized() -> bool:
    """Whether JAX has already started its backends (devices are fixed then)."""
    return bool(_xla_bridge.backends_are_initialized())


def vma(x: Any) -> frozenset[str]:
    """The set of mesh axes a value inside shard_map varies over.

    The type keeps it in ``.vma`` up to JAX 0.9.2, in ``.mat.varying`` from 0.10
    (where ``.vma`` is gone: reading it would say "varies over nothing").
    """
    aval = jax.typeof(x)
    if AVAL_VARYING_IN_MAT:
        return frozenset(aval.mat.varying)
    return frozenset(aval.vma)


def make_jax_mesh(
        shape: Sequence[int], names: Sequence[str], devices: Sequence[Any],
        axis_types: tuple[Any, ...],
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` with explicit devices and axis types on every version."""
    return jax.make_mesh(tuple(shape), tuple(names), axis_types=axis_types,
                       devices=list(devices))


@contextlib.contextmanager
def ppermute_axis_order_unchecked() -> Iterator[None]:
    """Turn off JAX's ppermute axis-order check (0.11.1+) inside the block.

    Only to show what unchecked JAX versions compute; a no-op where the check
    does not exist.
    """
    if not PPERMUTE_CHECKS_AXIS_ORDER:
        yield
        return
    previous = jax.config.jax_raise_on_ppermute_sort_diff
    jax.config.update("jax_raise_on_ppermute_sort_diff", False)
    try:
        yield
    finally:
        jax.config.update("jax_raise_on_ppermute_sort_diff", previous)


def context_mesh_axis_names() -> tuple[str, ...]:
    """Axis names of the mesh in scope (inside shard_map or pmap), in mesh order."""
    return tuple(jax.sharding.get_abstract_mesh().axis_names)


# -- the multi-process runtime (jax.distributed) ------------------------------

HAS_SHUTDOWN_TIMEOUT = ("shutdown_timeout_seconds"
                        in inspect.signature(jax.distributed.initialize).parameters)
"""``jax.distributed.initialize(shutdown_timeout_seconds=...)`` exists (0.8.1+)."""

HAS_CPU_COLLECTIVE_TIMEOUT_FLAG = JAX_VERSION >= (0, 10, 0)
"""XLA:CPU knows ``--xla_cpu_collective_timeout_seconds`` (0.10+; an unknown
flag in ``XLA_FLAGS`` aborts the process)."""


def initialize_distributed(
        coordinator_address: str, num_processes: int, process_id: int, *,
        bind_address: str | None, initialization_timeout: int,
        heartbeat_timeout: int, shutdown_timeout: int,
        local_device_ids: Sequence[int] | None = None,
) -> None:
    """``jax.distributed.initialize`` with every timeout bounded, on every version.

    ``shutdown_timeout`` is dropped where JAX has no such parameter (0.8.0);
    ``bind_address=None`` keeps JAX's default (every interface).
    """
    kwargs: dict[str, Any] = dict(
        coordinator_address=coordinator_address, num_processes=num_processes,
        process_id=process_id, coordinator_bind_address=bind_address,
        initialization_timeout=int(initialization_timeout),
        heartbeat_timeout_seconds=int(heartbeat_timeout),
        local_device_ids=None if local_device_ids is None else list(local_device_ids))
    if HAS_SHUTDOWN_TIMEOUT:
        kwargs["shutdown_timeout_seconds"] = int(shutdown_timeout)
    jax.distributed.initialize(**kwargs)


@dataclasses.dataclass(frozen=True)
class DetectedCluster:
    """What JAX's cluster auto-detection found (see :func:`detect_cluster`)."""

    name: str
    coordinator_address: str
    num_processes: int
    process_id: int
    local_device_ids: tuple[int, ...] | None


def detect_cluster(timeout: int | None = None) -> DetectedCluster | None:
    """The cluster JAX's ``jax.distributed.initialize()`` would detect, or None.

    The same search as JAX's own (its ``ClusterEnv`` list, in its order, opt-in
    methods such as mpi4py skipped), so the caller learns the coordinator,
    process count and id *before* joining. Which clusters exist depends on the
    JAX version: SLURM and Open MPI's ORTE (``OMPI_MCA_orte_hnp_uri``,
    Open MPI < 5) on every supported one; Open MPI 5 (PRRTE, through mpi4py)
    from 0.11.2; Kubernetes (the ``kubernetes`` package) and Cloud TPU.
    ``JAX_COORDINATOR_PORT`` overrides the port JAX derives from the job id.

    Raises:
      RuntimeError: JAX found a cluster but cannot read it (e.g. Open MPI 5
        without mpi4py).
    """
    for env in _clusters.ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False) or not env.is_env_present():
            continue
        kwargs: dict[str, Any] = {"timeout_secs": timeout}
        if "override_coordinator_port" in inspect.signature(
                env.get_coordinator_address).parameters:  # JAX 0.8.1+
            kwargs["override_coordinator_port"] = os.environ.get(
                "JAX_COORDINATOR_PORT")
        coordinator = env.get_coordinator_address(**kwargs)
        local = env.get_local_process_id()
        return DetectedCluster(
            name=str(getattr(env, "name", env.__name__)),
            coordinator_address=coordinator,
            num_processes=int(env.get_process_count()),
            process_id=int(env.get_process_id()),
            local_device_ids=None if local is None else (int(local),))
    return None


def key_value_set(key: str, value: str) -> None:
    """Store ``value`` under ``key`` in the coordination service (every process
    can read it; needs ``jax.distributed.initialize`` first)."""
    _distributed.global_state.client.key_value_set(key, value)


def key_value_get(key: str, timeout_s: float) -> str:
    """The value another process stored under ``key``, waiting up to ``timeout_s``.

    Raises:
      Exception: JAX's runtime error when the key does not appear in time.
    """
    return _distributed.global_state.client.blocking_key_value_get(
        key, max(1, int(timeout_s * 1000)))


def cpu_collective_timeout_flags(seconds: int) -> list[str]:
    """``XLA_FLAGS`` entries that bound how long a CPU collective waits for peers."""
    flags = [f"--xla_cpu_collective_call_terminate_timeout_seconds={int(seconds)}"]
    if HAS_CPU_COLLECTIVE_TIMEOUT_FLAG:
        flags.append(f"--xla_cpu_collective_timeout_seconds={int(seconds)}")
    return flags


def use_loopback_gloo() -> None:
    """Make the CPU backend's gloo collectives listen on 127.0.0.1 only.

    JAX builds gloo with no host name, so gloo listens on whatever address the
    machine's host name resolves to. This re-registers the CPU backend factory
    (before the backends start) with ``hostname="127.0.0.1"``; the factory is
    the same on JAX 0.8 to 0.12.

    Raises:
      RuntimeError: JAX's backends have already started.
    """
    if backends_initialized():
        raise RuntimeError(
            "use_loopback_gloo() came too late: JAX's backends already started. "
            "Fix: call it before the first JAX operation.")

    def make_cpu_client() -> Any:
        collectives = None
        if (_distributed.global_state.client is not None
                and jax.config.jax_cpu_collectives_implementation == "gloo"):
            collectives = _jaxlib.make_gloo_tcp_collectives(
                distributed_client=_distributed.global_state.client,
                hostname="127.0.0.1")
        return _xla_bridge.make_cpu_client(collectives=collectives)

    _xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0,
                                         fail_quietly=False)


# -- reading jaxprs: control flow and mapped bodies ---------------------------


class JaxprNotUnderstood(Exception):
    """An equation's parameters are not spelt as any supported JAX release
    spells them (a release newer than this package, most likely)."""


def _param(params: Any, name: str, primitive: str) -> Any:
    try:
        return params[name]
    except KeyError:
        raise JaxprNotUnderstood(
            f"JAX {jax.__version__}: a {primitive!r} equation has no parameter "
            f"{name!r} (it has {', '.join(sorted(params)) or 'none'})") from None


def scan_operands(params: Any, values: Sequence[Any]
                  ) -> tuple[list[Any], list[Any], list[Any]]:
    """``values``, one per operand of a ``scan`` equation, split into its
    constants, initial carry and scanned inputs (the order of the body's
    inputs)."""
    values = list(values)
    if "num_consts" in params:  # up to JAX 0.10
        n_consts = _param(params, "num_consts", "scan")
        n_carry = _param(params, "num_carry", "scan")
        return (values[:n_consts], values[n_consts:n_consts + n_carry],
                values[n_consts + n_carry:])
    consts, carry, xs = _param(params, "ft_in", "scan").update(values).unpack()
    return list(consts), list(carry), list(xs)


def scan_carry_count(params: Any) -> int:
    """How many of a ``scan`` body's outputs are its carry (the rest are the
    stacked outputs)."""
    if "num_carry" in params:  # up to JAX 0.10
        return int(params["num_carry"])
    carry, _ = _param(params, "ft_out", "scan").unpack()
    return len(list(carry))


def while_operands(params: Any, values: Sequence[Any]
                   ) -> tuple[Any, list[Any], list[Any]]:
    """``(body, body constants, carry)`` of a ``while`` equation whose
    operands ``values`` stand for (the condition's constants come first)."""
    n_cond = _param(params, "cond_nconsts", "while")
    n_body = _param(params, "body_nconsts", "while")
    values = list(values)
    return (_param(params, "body_jaxpr", "while"),
            values[n_cond:n_cond + n_body], values[n_cond + n_body:])


def cond_branches(params: Any) -> tuple[Any, ...]:
    """The branches of a ``cond`` equation (operand 0 is the index)."""
    return tuple(_param(params, "branches", "cond"))


def shard_map_body(params: Any) -> tuple[Any, dict[str, int]]:
    """A ``shard_map`` equation's body and the sizes of its mesh's axes."""
    return (_param(params, "jaxpr", "shard_map"),
            dict(_param(params, "mesh", "shard_map").shape))


def pmap_body(params: Any) -> tuple[Any, dict[str, int]]:
    """An ``xla_pmap`` equation's body and its axis name and size."""
    return (_param(params, "call_jaxpr", "xla_pmap"),
            {_param(params, "axis_name", "xla_pmap"):
             _param(params, "global_axis_size", "xla_pmap")})


# -- Pallas TPU interpret mode ------------------------------------------------

INTERPRET_KERNELS_SINCE = (0, 10, 2)
"""Remote DMAs from outputs in VMEM work from 0.10.0; from 0.10.2 a failure
on one simulated device stops the others (before, they could wait forever),
which is what lets :func:`stop_interpreted_kernels` end a hung kernel."""

HAS_INTERPRET_KERNELS = JAX_VERSION >= INTERPRET_KERNELS_SINCE


def _interpret_module() -> Any:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call
    return interpret_pallas_call


def interpret_races_found() -> bool:
    """Whether the race detector reported a race in the most recent
    interpreted kernel (``detect_races=True``). Interpret mode prints each
    race and sets ``races.races_found`` in its private module; there is no
    public getter (0.10.2 to 0.12)."""
    state = getattr(_interpret_module(), "races", None)
    return bool(state is not None and state.races_found)


def stop_interpreted_kernels(error: Exception) -> bool:
    """Fail the interpreted kernel now running, as if a device had raised
    ``error``: every simulated device waiting on a semaphore or a barrier
    wakes up and raises, and the call returns with an error instead of
    hanging. Returns whether a kernel was running. Interpret mode polls for
    such a failure in every wait (0.10.2 on); ``set_failed`` is private."""
    memory = getattr(_interpret_module(), "_shared_memory", None)
    if memory is None:
        return False
    memory.set_failed(error, top_level=False)
    return True


def break_interpret_cleanup() -> None:
    """Release the devices that wait at a failed kernel's clean-up barrier
    for a device that never started (the thread pool had no thread for it)."""
    memory = getattr(_interpret_module(), "_shared_memory", None)
    if memory is not None:
        memory.clean_up_barrier.abort()


def interpret_mode_in_force() -> Any:
    """The ``InterpretParams`` that ``pltpu.force_tpu_interpret_mode`` put in
    force in this thread, or None. JAX keeps them in a thread-local
    configuration value with no public getter (0.8 to 0.12)."""
    from jax._src import config

    state = getattr(config, "pallas_tpu_interpret_mode_context_manager", None)
    return None if state is None else state.value


def forced_interpret_mode(params: Any) -> contextlib.AbstractContextManager[Any]:
    """``pltpu.force_tpu_interpret_mode(params)``, or nothing for None: how a
    worker thread runs a kernel in its caller's interpret mode."""
    if params is None:
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.force_tpu_interpret_mode(params)


def reset_interpret() -> None:
    """Clear interpret mode's global state; needed after a kernel failed."""
    from jax.experimental.pallas import tpu as pltpu
    pltpu.reset_tpu_interpret_mode_state()


# -- Pallas TPU interpret mode: watching a kernel run -------------------------

INTERPRET_EVENTS = ("dma_start", "dma_bytes", "dma_wait", "signal", "wait",
                    "barrier")
"""What :func:`interpret_events` reports, each with its fields:

* ``dma_start``: ``device`` started DMA ``dma`` (an id) to ``target``,
  signalling ``send_sem`` (None for a local copy with none) on ``device``
  and ``recv_sem`` on ``target``;
* ``dma_bytes``: DMA ``dma`` read its ``bytes`` (it may do so later, on the
  receiver's wait, in interpret mode's ``on_wait`` DMA mode);
* ``dma_wait``: ``device`` waits until ``bytes`` have reached semaphore
  ``sem`` (one half of ``.wait()`` of an async copy);
* ``signal``: ``device`` adds ``inc`` to semaphore ``sem`` of ``target``;
* ``wait``: ``device`` waits for semaphore ``sem`` to reach ``value``;
* ``barrier``: ``device`` took semaphore ``sem`` as its barrier semaphore.

Semaphore ids are interpret mode's: scratch semaphores are numbered in the
order the kernel declares them, the same on every device; a barrier's id is
its ``collective_id``'s."""


@contextlib.contextmanager
def interpret_events(sink: Any) -> Iterator[None]:
    """Call ``sink(kind, fields)`` for every DMA and semaphore operation of
    the Pallas TPU kernels that interpret mode traces and runs inside the
    block (see :data:`INTERPRET_EVENTS`), from the simulated device's own
    thread, in its program order.

    Interpret mode has no public hook. Its kernel interpreter turns each DMA
    and semaphore primitive into an ``io_callback`` of a private function of
    ``jax._src.pallas.mosaic.interpret.interpret_pallas_call`` looked up when
    the kernel is traced (``dma_wait``, ``semaphore_signal``,
    ``semaphore_wait``, ``get_barrier_semaphore``), and ``dma_start`` builds
    a ``DMA`` object whose ``execute_read`` fetches the bytes. Those names
    and their leading arguments are the same in JAX 0.10.2 and 0.12.0.1;
    this wraps them for the duration of the block. JAX's caches are cleared
    on entry, so a kernel compiled before is traced again with the wrappers;
    a kernel compiled inside the block keeps them afterwards, reporting
    nothing.

    Raises:
      RuntimeError: this JAX runs no kernels in interpret mode
        (:data:`HAS_INTERPRET_KERNELS`), or its interpret mode lacks a name
        wrapped here.
    """
    if not HAS_INTERPRET_KERNELS:
        raise RuntimeError(
            f"JAX {jax.__version__} does not run Pallas kernels in interpret mode "
            "here. Fix: JAX 0.10.2 or newer.")
    module = _interpret_module()
    names = ("dma_wait", "semaphore_signal", "semaphore_wait",
             "get_barrier_semaphore", "DMA")
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise RuntimeError(
            f"JAX {jax.__version__}'s interpret mode has no {', '.join(missing)}: "
            "collectives._compat.interpret_events knows 0.10.2 to 0.12. Fix: "
            "record on a JAX release it knows.")
    active = [True]

    def report(kind: str, **fields: Any) -> None:
        if active[0]:
            sink(kind, fields)

    def sem_id(sem: Any) -> int | None:
        return None if sem is None else int(sem.id)

    originals = {name: getattr(module, name) for name in names}
    dma_class = originals["DMA"]
    execute_read = dma_class.execute_read

    def make_dma(*args: Any, **kwargs: Any) -> Any:
        dma = dma_class(*args, **kwargs)
        report("dma_start", device=int(dma.src_device_id),
               target=int(dma.dst_device_id), dma=int(dma.id),
               send_sem=sem_id(dma.src_sem), recv_sem=sem_id(dma.dst_sem))
        return dma

    def read(self: Any) -> None:
        execute_read(self)
        if self.data is not None:
            report("dma_bytes", dma=int(self.id), bytes=int(self.data_size))

    def wrap(name: str, kind: str, fields: Any) -> Any:
        original = originals[name]
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs).arguments
            result = original(*args, **kwargs)
            report(kind, **fields(bound, result))
            return result

        return wrapped

    def device(bound: Any) -> int:
        return int(bound["device_id"])

    wrappers = {
        "dma_wait": wrap("dma_wait", "dma_wait", lambda a, _: dict(
            device=device(a), sem=int(a["sem_id"]), bytes=int(a["size"]))),
        "semaphore_signal": wrap("semaphore_signal", "signal", lambda a, _: dict(
            device=device(a), sem=int(a["sem_id"]), inc=int(a["inc"]),
            target=device(a) if a["target_device_id"] is None
            else int(a["target_device_id"]))),
        "semaphore_wait": wrap("semaphore_wait", "wait", lambda a, _: dict(
            device=device(a), sem=int(a["sem_id"]), value=int(a["value"]))),
        "get_barrier_semaphore": wrap(
            "get_barrier_semaphore", "barrier",
            lambda a, result: dict(device=device(a), sem=int(result[1]))),
        "DMA": make_dma,
    }
    jax.clear_caches()
    for name, wrapper in wrappers.items():
        setattr(module, name, wrapper)
    dma_class.execute_read = read
    try:
        yield
    finally:
        active[0] = False
        dma_class.execute_read = execute_read
        for name, original in originals.items():
            setattr(module, name, original)
