"""How many roundings one output element can accumulate, read from a jaxpr.

:func:`infer_n_terms` traces forms with ``jax.make_jaxpr`` and walks their
equations, giving every value the longest chain of rounded operations
behind it: a sum of ``R`` terms (``reduce_sum``, ``psum``, a ``dot_general``
contracting ``R``) adds ``R`` to its input's chain, ``add`` one to the
longer operand's, ``mul`` one to the sum of both; data movement adds
nothing; inner programs and loops are walked. The rule and why it is sound:
"Inferred n_terms" in docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core

from collectives import _compat

BUDGET = 200_000
"""Equations walked (loop bodies once per step) before giving up."""


@dataclasses.dataclass(frozen=True)
class Chain:
    """The longest chain of roundings behind a value.

    Attributes:
      count: the roundings on it.
      steps: ``(label, weight, times)`` for each kind of step on it, in the
        order first met; ``count`` is the sum of ``weight * times``.
      from_args: whether the value depends on the traced arguments.
    """

    count: int = 0
    steps: tuple[tuple[str, int, int], ...] = ()
    from_args: bool = False

    def then(self, label: str, weight: int) -> Chain:
        """This chain followed by one step of ``weight`` roundings."""
        if weight <= 0:
            return self
        return Chain(self.count + weight, _merged(self.steps, ((label, weight, 1),)),
                     self.from_args)

    def describe(self) -> str:
        """``dot_general over 128 + add (7 times)``."""
        if not self.steps:
            return "no rounding: data movement only"
        return " + ".join(label if times == 1 else f"{label} ({times} times)"
                          for label, _, times in self.steps)


EXACT = Chain()


def _merged(steps: tuple[tuple[str, int, int], ...],
            more: tuple[tuple[str, int, int], ...], factor: int = 1
            ) -> tuple[tuple[str, int, int], ...]:
    merged = {label: [weight, times] for label, weight, times in steps}
    for label, weight, times in more:
        merged.setdefault(label, [weight, 0])[1] += times * factor
    return tuple((label, weight, times) for label, (weight, times) in merged.items())


def _longest(chains: Sequence[Chain]) -> Chain:
    """The longest of ``chains`` (a sum, a choice or data movement of them)."""
    best = max(chains, key=lambda c: c.count, default=EXACT)
    from_args = any(c.from_args for c in chains)
    return best if best.from_args == from_args else dataclasses.replace(
        best, from_args=from_args)


def _joined(chains: Sequence[Chain], factor: int = 1) -> Chain:
    """Every chain in ``chains``, ``factor`` times (a product of them)."""
    count, steps = 0, ()
    for chain in chains:
        count += chain.count * factor
        steps = _merged(steps, chain.steps, factor)
    return Chain(count, steps, any(c.from_args for c in chains))


class Uncountable(Exception):
    """A form's roundings cannot be counted (the message says why)."""


class Unwalkable(Uncountable):
    """A form's jaxpr holds an equation this package cannot read: the running
    JAX spells its parameters as no supported release did (the message names
    the JAX version and the equation). Unlike other reasons, this one says
    nothing about the program, so no bound may be guessed for it."""


UNTRACEABLE = "jax.make_jaxpr cannot trace it"


@dataclasses.dataclass
class _Walk:
    axes: dict[str, int]
    left: list[int]  # shared by every nested walk

    def within(self, axes: Any) -> _Walk:
        return _Walk({**self.axes, **dict(axes)}, self.left)

    def visit(self) -> None:
        self.left[0] -= 1
        if self.left[0] < 0:
            raise Uncountable(f"more than {BUDGET} equations to walk (a long scan)")


def _inexact(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    try:
        return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def _rounds(source: Any, target: Any) -> bool:
    """Whether converting ``source`` values to float ``target`` can round."""
    source, target = np.dtype(source), np.dtype(target)
    if jnp.issubdtype(source, jnp.inexact):
        return jnp.finfo(target).nmant < jnp.finfo(source).nmant
    if jnp.issubdtype(source, jnp.integer):
        return jnp.iinfo(source).bits > jnp.finfo(target).nmant + 1
    return False


def _run(jaxpr: Any, ins: Sequence[Chain], walk: _Walk) -> list[Chain]:
    """The chains of ``jaxpr``'s outputs (a Jaxpr or ClosedJaxpr) given its inputs'."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    chains: dict[Any, Chain] = dict.fromkeys(jaxpr.constvars, EXACT)
    chains.update(zip(jaxpr.invars, ins, strict=True))

    def read(var: Any) -> Chain:
        return EXACT if isinstance(var, jax_core.Literal) else chains[var]

    for eqn in jaxpr.eqns:
        walk.visit()
        inputs = [read(v) for v in eqn.invars]
        try:
            outs = _equation(eqn, inputs, walk)
        except Uncountable:
            raise
        except Exception as err:  # parameters this JAX spells anew
            raise Unwalkable(
                f"JAX {jax.__version__} cannot be read: its {eqn.primitive.name!r} "
                f"equation raised {type(err).__name__}: {err}") from None
        for var, chain in zip(eqn.outvars, outs, strict=True):
            if not _inexact(var.aval):  # integers and booleans are exact
                chain = Chain(from_args=any(c.from_args for c in inputs))
            chains[var] = chain
    return [read(v) for v in jaxpr.outvars]


_MOVES = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "scatter", "concatenate",
    "pad", "rev", "select_n", "clamp", "copy", "copy_p", "neg", "abs", "max",
    "min", "sign", "floor", "ceil", "round", "reduce_max", "reduce_min",
    "argmax", "argmin", "cummax", "cummin", "sort", "top_k", "split", "real",
    "imag", "conj", "complex", "ppermute", "all_gather", "all_gather_invariant",
    "all_to_all", "pmax", "pmin", "pbroadcast", "pvary", "pcast", "device_put",
    "sharding_constraint", "mesh_cast", "reshard", "stop_gradient",
    "optimization_barrier", "bitcast_convert_type", "axis_index", "iota",
})
_SUMS = {"add": "add", "add_any": "add", "sub": "sub"}
_PRODUCTS = frozenset({"mul", "div", "rem", "pow", "atan2"})
_PSUMS = {"psum": "psum", "psum_invariant": "psum", "psum2": "psum",
          "reduce_scatter": "psum_scatter"}


def _shape(eqn: Any, i: int) -> tuple[int, ...]:
    return tuple(eqn.invars[i].aval.shape)


def _dot_general(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    (contracting, _), _ = eqn.params["dimension_numbers"]
    k = math.prod(_shape(eqn, 0)[d] for d in contracting)
    return [_joined(ins[:2]).then(f"dot_general over {k}", k)]


def _conv(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    rhs = _shape(eqn, 1)
    out_features = eqn.params["dimension_numbers"].rhs_spec[0]
    k = math.prod(rhs) // max(rhs[out_features], 1)
    return [_joined(ins[:2]).then(f"conv_general_dilated over {k}", k)]


def _reduction(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    name, shape = eqn.primitive.name, _shape(eqn, 0)
    if "axes" in eqn.params:
        r = math.prod(shape[a] for a in eqn.params["axes"])
    elif "window_dimensions" in eqn.params:
        r = math.prod(eqn.params["window_dimensions"])
    else:
        r = shape[eqn.params["axis"]]
    if r <= 1:
        return [ins[0]]
    if name in ("reduce_prod", "cumprod"):  # the factors' roundings add up
        return [_joined(ins[:1], r).then(f"{name} over {r}", r)]
    return [ins[0].then(f"{name} over {r}", r)]


def _psum(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    params = eqn.params
    names = params.get("axes", params.get("axis_name"))
    names = names if isinstance(names, tuple | list) else (names,)
    groups = params.get("axis_index_groups")
    size, known, shown = 1, True, []
    for name in names:
        if isinstance(name, int):  # a positional axis of the operand
            size *= _shape(eqn, 0)[name]
        elif name in walk.axes:
            size *= walk.axes[name]
        else:
            known = False
        shown.append(str(name))
    if "axis_size" in params:  # psum_scatter knows it
        size, known = params["axis_size"], True
    if groups:
        size, known = len(groups[0]), True
    label = f"{_PSUMS[eqn.primitive.name]} over {size} on axis {', '.join(shown)}"
    if not known:  # an axis bound outside the traced program
        size = max(size, jax.device_count())
        label = (f"{_PSUMS[eqn.primitive.name]} on axis {', '.join(shown)} "
                 f"(size unknown: at most {size} devices)")
    return [c.then(label, size) if size > 1 else c for c in ins]


def _integer_pow(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    y = eqn.params["y"]
    weight = max(abs(y) - 1, 0) + (y < 0)
    return [_joined(ins, abs(y)).then(f"integer_pow {y}", weight)]


def _square(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    return [_joined(ins, 2).then("square", 1)]


def _convert(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    source, target = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
    if _inexact(eqn.outvars[0].aval) and _rounds(source, target):
        return [ins[0].then(f"round {np.dtype(source).name} to "
                            f"{np.dtype(target).name}", 1)]
    return [ins[0]]


def _scatter_add(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    window = eqn.params["dimension_numbers"].update_window_dims
    n = math.prod(size for d, size in enumerate(_shape(eqn, 2)) if d not in window)
    return [_longest([ins[0], ins[2]]).then(f"scatter-add over {n + 1}", n + 1)]


def _scan(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    params = eqn.params
    consts, carry, xs = _compat.scan_operands(params, ins)
    n_carry = _compat.scan_carry_count(params)
    ys: list[Chain] | None = None
    for _ in range(params["length"]):
        out = _run(params["jaxpr"], [*consts, *carry, *xs], walk)
        new, step_ys = out[:n_carry], out[n_carry:]
        ys = step_ys if ys is None else [_longest(p) for p in zip(ys, step_ys,
                                                                  strict=True)]
        settled = [c.count for c in new] == [c.count for c in carry]
        carry = new
        if settled:  # every further step gives the same counts
            break
    if ys is None:
        ys = [EXACT] * (len(eqn.outvars) - n_carry)
    return [*carry, *ys]


def _while(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    body, consts, bound = _compat.while_operands(eqn.params, ins)
    for _ in range(32):  # bound: the longest chain after any number of steps
        new = _run(body, [*consts, *bound], walk)
        if all(n.count <= b.count for n, b in zip(new, bound, strict=True)):
            return [_longest(p) for p in zip(bound, new, strict=True)]
        bound = [_longest(p) for p in zip(bound, new, strict=True)]
    raise Uncountable("a while_loop adds roundings at every step and its trip "
                    "count is not known when tracing")


def _cond(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    outs = [_run(branch, ins[1:], walk)
            for branch in _compat.cond_branches(eqn.params)]
    return [_longest(column) for column in zip(*outs, strict=True)]


def _shard_map(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    body, axes = _compat.shard_map_body(eqn.params)
    return _run(body, ins, walk.within(axes))


def _pmap(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    body, axes = _compat.pmap_body(eqn.params)
    return _run(body, ins, walk.within(axes))


_RULES: dict[str, Callable[[Any, list[Chain], _Walk], list[Chain]]] = {
    "dot_general": _dot_general, "conv_general_dilated": _conv,
    "reduce_sum": _reduction, "reduce_prod": _reduction, "cumsum": _reduction,
    "cumprod": _reduction, "cumlogsumexp": _reduction,
    "reduce_window_sum": _reduction, **dict.fromkeys(_PSUMS, _psum),
    "integer_pow": _integer_pow, "square": _square,
    "convert_element_type": _convert, "scatter-add": _scatter_add,
    "scatter_add": _scatter_add, "scan": _scan, "while": _while, "cond": _cond,
    "shard_map": _shard_map, "xla_pmap": _pmap,
}


def _inner(params: dict[str, Any]) -> list[Any]:
    """The jaxprs among an equation's parameters."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, jax_core.Jaxpr | jax_core.ClosedJaxpr):
                found.append(item)
    return found


def _equation(eqn: Any, ins: list[Chain], walk: _Walk) -> list[Chain]:
    name, n_out = eqn.primitive.name, len(eqn.outvars)
    if name in _RULES:
        return _RULES[name](eqn, ins, walk)
    if name in _MOVES:
        return [_longest(ins)] * n_out
    if name in _SUMS:
        return [_longest(ins).then(_SUMS[name], 1)]
    if name in _PRODUCTS:
        return [_joined(ins).then(name, 1)]
    inner = _inner(eqn.params)
    for jaxpr in inner:  # a call: jit, custom_jvp/vjp, checkpoint, ...
        body = getattr(jaxpr, "jaxpr", jaxpr)
        if len(body.invars) == len(ins) and len(body.outvars) == n_out:
            return _run(jaxpr, ins, walk)
    # anything else rounds once more than all its inputs and inner programs
    own = [_longest(_run(j, [EXACT] * len(getattr(j, "jaxpr", j).invars), walk))
           for j in inner]
    return [_joined([*ins, *own]).then(name, 1)] * n_out


@dataclasses.dataclass(frozen=True)
class Inference:
    """What :func:`infer_n_terms` found.

    Attributes:
      n_terms: the longest chain's count, or None if no form could be counted.
      form: the form whose chain it is.
      chain: that chain, described.
      skipped: ``(form, why)`` for each form that was not counted.
      unreadable: ``(form, why)`` for each form among ``skipped`` whose
        jaxpr this package cannot read (:class:`Unwalkable`): ``n_terms``
        is then no bound, whatever the other forms gave.
    """

    n_terms: int | None
    form: str | None = None
    chain: str = ""
    skipped: tuple[tuple[str, str], ...] = ()
    unreadable: tuple[tuple[str, str], ...] = ()

    def describe(self, reference: str) -> tuple[str, str]:
        """Where ``n_terms`` came from (or why there is none), and how to set
        it; ``reference`` is the name of the form called "the reference"."""
        if self.n_terms is None:
            tried = "; ".join(f"{form}: {why}" for form, why in self.skipped)
            return (f"not inferred, no form's jaxpr could be counted ({tried})",
                    "pass n_terms=, the rounded operations behind one output "
                    "element")
        source = ("the reference's" if self.form == reference
                  else f"the {self.form} form's")
        # forms that traced but have no bound are worth naming; NumPy is not
        not_counted = "".join(f"; {form} not counted: {why}"
                              for form, why in self.skipped
                              if not why.startswith(UNTRACEABLE))
        return (f"inferred from {source} jaxpr (longest chain of roundings: "
                f"{self.chain}{not_counted})", "pass n_terms= to override")


def _traced(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray | np.generic | jax.Array)


def count_roundings(fn: Callable[..., Any], args: Sequence[Any]) -> Chain:
    """The longest chain behind any float output of ``fn(*args)``.

    Array arguments are traced; other leaves (Python numbers, meshes, ...)
    stay static. A float64 array traced as float32 (``jax_enable_x64`` off)
    starts with one rounding.

    Raises:
      Uncountable: ``fn`` cannot be traced, its float outputs do not depend on
        its arguments, or its jaxpr has no bound (the message says which).
      Unwalkable: its jaxpr holds an equation this package cannot read.
    """
    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    where = [i for i, leaf in enumerate(leaves) if _traced(leaf)]

    def on_traced(*values: Any) -> Any:
        full = list(leaves)
        for i, value in zip(where, values, strict=True):
            full[i] = value
        return fn(*jax.tree_util.tree_unflatten(tree, full))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            closed = jax.make_jaxpr(on_traced)(*(leaves[i] for i in where))
    except Exception as err:  # NumPy code, host round trips, Python control flow
        raise Uncountable(f"{UNTRACEABLE} ({type(err).__name__})") from None
    starts = []
    for i, var in zip(where, closed.jaxpr.invars, strict=True):
        given = np.dtype(leaves[i].dtype)
        chain = Chain(from_args=True)
        if _inexact(var.aval) and _rounds(given, var.aval.dtype):
            chain = chain.then(f"{given.name} input rounded to "
                               f"{np.dtype(var.aval.dtype).name}", 1)
        starts.append(chain)
    chains = _run(closed, starts, _Walk({}, [BUDGET]))
    outs = [c for c, var in zip(chains, closed.jaxpr.outvars, strict=True)
            if c.from_args and _inexact(var.aval)]
    if not outs:
        raise Uncountable("no float output of it depends on its arguments")
    return _longest(outs)


def infer_n_terms(candidates: Sequence[tuple[str, Callable[..., Any]]],
                  args: Sequence[Any]) -> Inference:
    """The longest chain among ``candidates`` (``(form, fn)`` pairs; on a
    tie, the first). Each is called once more, under ``jax.make_jaxpr``."""
    skipped, unreadable = [], []
    best: tuple[str, Chain] | None = None
    for form, fn in candidates:
        try:
            chain = count_roundings(fn, args)
        except Uncountable as why:
            skipped.append((form, str(why)))
            if isinstance(why, Unwalkable):
                unreadable.append((form, str(why)))
            continue
        if best is None or chain.count > best[1].count:
            best = (form, chain)
    if best is None:
        return Inference(None, skipped=tuple(skipped), unreadable=tuple(unreadable))
    form, chain = best
    return Inference(chain.count, form, chain.describe(), tuple(skipped),
                     tuple(unreadable))
