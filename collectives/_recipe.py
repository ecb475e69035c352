"""One recipe, three forms, one oracle.

A :class:`Recipe` bundles a per-shard body written with named-axis
collectives, the global-view program that ``jit`` partitions automatically,
the ``PartitionSpec`` of each input and output, and a NumPy oracle. Its
methods run the body as ``jax.pmap`` and as ``jax.shard_map``, the program
under ``jax.jit`` with ``NamedSharding``, and the oracle on the host, all on
the same global-view arrays, so their results compare directly.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives import _compat
from collectives import _devices
from collectives import _kernels
from collectives import _layout
from collectives._arrays import KINDS
from collectives._arrays import brief
from collectives._arrays import canonical
from collectives._arrays import check_dims
from collectives._arrays import check_fits_canonical
from collectives._arrays import dtype_kind
from collectives._arrays import is_shape
from collectives._arrays import random_array
from collectives._layout import Axes
from collectives._layout import AxisArg
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._presentation import PlanSpec
from collectives._stacked import map_leaves
from collectives._stacked import stack_args
from collectives._stacked import stacked_in_axes
from collectives._stacked import unstack_outputs
from collectives.hlo import Expectation

FORMS: tuple[str, ...] = ("pmap", "shard_map", "jit", "explicit")
"""The three forms every recipe runs in, legacy first."""

FAMILIES: tuple[str, ...] = ("core", "pattern", "strategy", "kernel")
"""What a recipe is, in the order the gallery shows them: a core collective
(its name is a contract), a pattern built from collectives, a parallelism
strategy for training, or a collective written one level down, as a Pallas
kernel of remote DMAs and semaphores."""

WIDE_FLOATS = frozenset({"float32", "float64"})
"""``exact_dtypes`` of the recipes that multiply their inputs."""


class UnsupportedDtypeError(TypeError):
    """A recipe refuses a dtype of a kind it otherwise accepts, because its
    arithmetic would give a wrong answer in it (e.g. Adam's ``eps`` rounds to
    0 in float16). :func:`collectives.check` lists such rows as skipped, with
    the reason."""


CostModel = Callable[[Axes, tuple[Any, ...], str],
                     "Expectation | Sequence[Expectation]"]
"""``cost_model(axes, args, form)``: what the compiled form must contain."""

class RecipeUnavailable(NotImplementedError):
    """The recipe's body does not run here: on this JAX release, in this
    process, or on this backend (its ``form_reason`` for the shard_map form
    says why). :func:`collectives.check` lists such rows as skipped, with
    the reason."""


DEFAULT_DIMS: tuple[int, ...] = (2, 3)
"""The dims of :meth:`Recipe.example_args` unless given (``check --dims``)."""


def _no_terms(axes: Axes) -> int:
    del axes
    return 0


def _taking_args(n_terms: Callable[..., int]) -> Callable[..., int]:
    """An ``n_terms`` fact as ``n_terms(axes, args=None)``: a fact of the
    axes alone ignores the arguments."""
    try:
        takes_args = len(inspect.signature(n_terms).parameters) > 1
    except (TypeError, ValueError):  # a builtin without a signature
        takes_args = False
    return n_terms if takes_args else _OfAxes(n_terms)


class _OfAxes:
    """``n_terms(axes)`` called as ``n_terms(axes, args=None)``; shown as
    the fact itself."""

    def __init__(self, n_terms: Callable[[Axes], int]) -> None:
        self._n_terms = n_terms

    def __call__(self, axes, args=None):  # (unannotated: shown as the fact)
        del args
        return self._n_terms(axes)

    def __repr__(self) -> str:
        return repr(self._n_terms)


def _any_axes(axes: Axes) -> str | None:
    del axes
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class Recipe:
    """A collective written once and run in every form against an oracle.

    The algorithm (``body``, ``program``, ``oracle``) comes from the recipe's
    file in ``recipes/``; the rest are the facts the library needs about it.

    Attributes:
      name: the registry name, e.g. ``"psum"``.
      summary: one line for ``python -m collectives list``.
      body: the per-shard function, ``body(*blocks, axis=...)``, written with
        ``lax`` collectives over ``axis`` (a mesh axis name or a tuple).
      program: the global-view function for the jit form,
        ``program(*arrays, axes=...)``; ``jit`` inserts the collectives.
      oracle: the NumPy reference on global arrays, ``oracle(*arrays, axes=...)``.
      in_specs: ``in_specs(axes)`` gives one spec (or spec tree) per argument.
      out_specs: ``out_specs(axes)`` gives the spec tree of the outputs.
      example_shapes: ``example_shapes(axes, dims)`` gives one shape (or
        shape tree) per argument that the recipe accepts, built from the small
        positive ints ``dims`` (at least two).
      family: one of :data:`collectives.FAMILIES`; ``"core"`` recipes are the
        contract names and come first in :data:`collectives.RECIPES`.
      recipe_file: its file in ``recipes/`` (e.g. ``"reductions.py"``), where
        ``body``, ``program`` and ``oracle`` are written; executed by the
        tests and rendered in the gallery.

      *Inputs*

      arg_names: the argument names used in error messages.
      dtype_kinds: the dtype kinds the recipe accepts (``float``, ``int``,
        ``bool``, ``complex``).
      validate: optional extra check, ``validate(axes, args)``, that raises a
        ``ValueError`` for inputs the specs alone cannot rule out.
      unsupported_reason: ``unsupported_reason(axes)`` returns ``None`` when
        the recipe can run over these axes, else a sentence saying what it
        needs (e.g. "needs a 2-D mesh: a data axis and a model axis"); the
        forms raise it as a ``ValueError`` and ``check`` skips such
        configurations.

      *Forms*

      pmap_body: the body for the pmap form where legacy pmap code differs
        from shard_map code (default: ``body``). Under pmap, mesh axes after
        the first are mapped with ``vmap``, which batches some collectives
        (gathers, scatters, permutes) only one axis at a time, and pmap has
        no varying/invariant types.
      check_vma: passed to ``jax.shard_map``.
      explicit_program: the global-view function of the explicit form,
        ``explicit_program(*arrays, axes=...)``, traced on a mesh whose axes
        are all ``Explicit`` (shardings in the types: ``reshard``,
        ``out_sharding=``, ``auto_axes``): the recipe file's
        ``<name>_explicit_program``, from its explicit region (it may call the
        jit form's program); ``None``: ``program`` itself. Its outputs are
        resharded to ``out_specs``.
      explicit_reason: ``explicit_reason(axes)`` says why the explicit form
        does not run on these axes (on this JAX), or ``None`` where it runs;
        ``check`` shows the reason as a skipped row.
      form_reason: ``form_reason(form, axes)`` says why ``form`` (any of
        :data:`FORMS`) does not run on these axes, on this JAX, in this
        process, or ``None`` where it runs (a Pallas kernel runs under
        shard_map only, and only where interpret mode or a TPU runs it).
        Where the shard_map form does not run, ``check`` skips the row with
        the reason: the body is the recipe.

      *Tolerance*

      n_terms: ``n_terms(axes)`` is how many rounded operations feed each
        output element (0 for pure data movement); it scales the tolerance.
        Where the count follows the inputs' shapes (a matmul sums ``K``
        products per element), the fact takes them too:
        ``n_terms(axes, args=None)``, ``None`` standing for the example
        shapes at their default dims. The recipe's ``n_terms`` always takes
        ``(axes, args=None)``; ``check`` and the comparison pass the args.
      magnitudes: optional, for a recipe whose arithmetic multiplies its
        inputs: ``magnitudes(*args, axes=...)`` returns, for each output
        element (the oracle's output structure), the root-sum-square of
        the terms that make it (the oracle's arithmetic on squared values,
        ``sqrt(A**2 @ B**2)`` for a product). The tolerance's ``atol`` then
        scales per element by it (at least by the largest input): rounding
        errors of terms with mixed signs add like a random walk, so a
        result that cancels to near zero keeps an error of that size.
        ``None``: the largest ``|input|`` for every element (a collective
        adds its inputs).
      bitwise: whether exact-valued inputs (small integers, see
        :meth:`example_args`) give the oracle's result bit for bit in every
        form; ``False`` where the recipe's own arithmetic rounds (a mean over
        an odd batch, a softmax), so the tolerance policy applies instead.
      exact_dtypes: the dtypes whose exact-valued inputs keep every
        intermediate value of the recipe an integer in range and held
        exactly, the only dtypes drawn exact-valued cases use
        (:func:`collectives.testing.strategies.recipe_cases`, the
        conformance suite); ``None``: every dtype the recipe accepts (a
        collective adds a few small integers, exact even in bfloat16). A
        recipe that multiplies its inputs (a linear model's gradient, an
        MLP's four matmuls and squared loss) leaves bfloat16's 8-bit and
        float16's 11-bit significands, and float16's range, so it names the
        wide dtypes.

      *Cost model and presentation*

      cost_model: ``cost_model(axes, args, form)`` for ``form`` in
        ``("shard_map", "jit")``: the :class:`collectives.hlo.Expectation`
        the compiled program of that form must meet on the placed ``args``
        (or a sequence of them, any of which is accepted, where the
        compiler's choice depends on the backend). The conformance suite
        compiles every recipe and checks it.
      diagram: how :func:`collectives.diagram` draws it (a
        :class:`DiagramSpec`), or ``None`` for recipes it does not draw.
      bench: how the benchmark times it (a :class:`BenchSpec`), or ``None``
        for recipes it does not time.
      plan: how ``python -m collectives plan`` sizes it for a model at scale
        (a :class:`PlanSpec`), or ``None`` for recipes it does not plan.

    """

    # the contract: the algorithm (from the recipe file) and its layouts
    name: str
    summary: str
    body: Callable[..., Any]
    program: Callable[..., Any]
    oracle: Callable[..., Any]
    in_specs: Callable[[Axes], tuple[Any, ...]]
    out_specs: Callable[[Axes], Any]
    example_shapes: Callable[[Axes, Sequence[int]], tuple[Any, ...]]
    family: str = "pattern"
    recipe_file: str | None = None
    # inputs
    arg_names: tuple[str, ...] = ("x",)
    dtype_kinds: frozenset[str] = KINDS
    validate: Callable[[Axes, Sequence[Any]], None] | None = None
    unsupported_reason: Callable[[Axes], str | None] = _any_axes
    # forms
    pmap_body: Callable[..., Any] | None = None
    check_vma: bool = True
    explicit_program: Callable[..., Any] | None = None
    explicit_reason: Callable[[Axes], str | None] | None = None
    form_reason: Callable[[str, Axes], str | None] | None = None
    # tolerance
    n_terms: Callable[..., int] = _no_terms
    magnitudes: Callable[..., Any] | None = None
    bitwise: bool = True
    exact_dtypes: frozenset[str] | None = None
    # cost model and presentation
    cost_model: CostModel | None = None
    diagram: DiagramSpec | None = None
    bench: BenchSpec | None = None
    plan: PlanSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_terms", _taking_args(self.n_terms))
        if self.family not in FAMILIES:
            raise ValueError(
                f"{self.name}: family={self.family!r} is not one of "
                f"{', '.join(FAMILIES)}. Fix: pass one of those.")
        if self.exact_dtypes is not None:
            kinds = {dtype_kind(d) for d in self.exact_dtypes}
            if not self.exact_dtypes or not kinds <= self.dtype_kinds:
                raise ValueError(
                    f"{self.name}: exact_dtypes={sorted(self.exact_dtypes)} names no "
                    f"dtype or one the recipe does not accept (dtype_kinds="
                    f"{sorted(self.dtype_kinds)}). Fix: name accepted dtypes, or "
                    "pass None for all of them.")

    def draws_exact(self, dtype: Any) -> bool:
        """Whether exact-valued inputs of ``dtype`` suit this recipe: it
        accepts the dtype's kind and ``exact_dtypes`` (if given) names it."""
        name = np.dtype(dtype).name
        return (dtype_kind(name) in self.dtype_kinds
                and (self.exact_dtypes is None or name in self.exact_dtypes))

    def expected_costs(self, form: str, axes: Axes, args: Sequence[Any]
                     ) -> tuple[Expectation, ...]:
        """The expectations the ``form``'s compiled program may meet (any one).

        Raises:
          ValueError: the recipe declares no ``cost_model``, or ``form`` is not a
            placed form.
        """
        if form not in PLACED_FORMS:
            raise ValueError(
                f"form: expected one of {', '.join(PLACED_FORMS)}, got {form!r}; "
                "the pmap form is pinned by its own test.")
        if self.cost_model is None:
            raise ValueError(
                f"{self.name}: declares no cost model. Fix: pass cost_model=... to its "
                "Recipe (see CONTRIBUTING.md).")
        found = self.cost_model(axes, tuple(args), form)
        return (found,) if isinstance(found, Expectation) else tuple(found)

    # -- the public forms -------------------------------------------------

    def pmap(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
             axis: AxisArg = None) -> Any:
        """Run the body under ``jax.pmap`` (the legacy form); global view in/out.

        The first mesh axis is mapped over devices with ``pmap``; further mesh
        axes are mapped with ``vmap(axis_name=...)`` on each device, since
        nested ``pmap`` raises on JAX >= 0.8. Outputs declared replicated are
        checked copy by copy.

        Raises:
          ReplicationError: an output declared replicated differs between
            device copies.
        """
        return self.run("pmap", args, self.validated_axes(args, mesh, axis))

    def shard_map(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
                  axis: AxisArg = None) -> Any:
        """Run the body under ``jax.jit(jax.shard_map(...))``; global view in/out."""
        return self.run("shard_map", args, self.validated_axes(args, mesh, axis))

    def jit(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
            axis: AxisArg = None) -> Any:
        """Run the global program under ``jax.jit`` with ``NamedSharding``."""
        return self.run("jit", args, self.validated_axes(args, mesh, axis))

    def explicit(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
                 axis: AxisArg = None) -> Any:
        """Run the global program in Explicit mode: under ``jax.jit`` on the
        mesh's devices with every axis ``Explicit``, the inputs placed with
        their specs (shardings in the types), the outputs resharded to theirs.

        Raises:
          NotImplementedError: the recipe's ``explicit_reason`` names why the
            explicit form does not run on these axes.
        """
        return self.run("explicit", args, self.validated_axes(args, mesh, axis))

    def reference(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
                  axis: AxisArg = None) -> Any:
        """The NumPy oracle on the host: what every form must return."""
        return self.run("reference", args, self.validated_axes(args, mesh, axis))

    def term_magnitudes(self, *args: Any, mesh: jax.sharding.Mesh | None = None,
                        axis: AxisArg = None) -> Any:
        """The ``magnitudes`` fact on ``args`` (host arrays, float64), or
        ``None`` where the recipe declares none."""
        if self.magnitudes is None:
            return None
        return self.run("magnitudes", args, self.validated_axes(args, mesh, axis))

    def run(self, form: str, args: Sequence[Any], axes: Axes) -> Any:
        """Run one form on arguments :meth:`validated_axes` accepted for ``axes``.

        The forms above validate, then call this; a caller that runs several
        forms on the same arguments (``check``, the comparison) validates
        once and calls this for each.

        Args:
          form: ``"pmap"``, ``"shard_map"``, ``"jit"``, ``"explicit"``,
            ``"reference"`` (the oracle) or ``"magnitudes"`` (the
            ``magnitudes`` fact, or None).
          args: the global-view arguments.
          axes: what :meth:`validated_axes` returned for them.
        """
        if form == "pmap":
            reason = self.unrunnable_form(form, axes)
            if reason:
                raise NotImplementedError(
                    f"{self.name}: the pmap form does not run here: {reason}")
            out = pmap_callable(self, axes)(*stack_args(self, axes, args))
            return jax.tree_util.tree_map(jnp.asarray,
                                          unstack_outputs(self, axes, out, "pmap"))
        if form in PLACED_FORMS:
            return _build(self, form, axes)(*self._placed(args, axes, form))
        host = {"reference": self.oracle, "magnitudes": self.magnitudes}
        if form not in host:
            raise ValueError(
                f"form: expected one of {', '.join((*FORMS, *host))}, got {form!r}.")
        if host[form] is None:
            return None
        return host[form](*jax.tree_util.tree_map(canonical, args), axes=axes)

    def unrunnable_form(self, form: str, axes: Axes) -> str | None:
        """Why ``form`` does not run on ``axes``, or ``None`` where it runs."""
        if self.form_reason is not None:
            reason = self.form_reason(form, axes)
            if reason is not None:
                return reason
        if form == "explicit" and self.explicit_reason is not None:
            return self.explicit_reason(axes)
        return None

    def bound_forms(self, axes: Axes) -> dict[str, Callable[..., Any]]:
        """The forms that run on ``axes`` and the oracle for arguments already validated
        for ``axes`` (:meth:`validated_axes`): callables that do not validate
        again."""
        return {form: functools.partial(_run_unpacked, self, form, axes)
                for form in (*FORMS, "reference")
                if self.unrunnable_form(form, axes) is None}

    # -- helpers other modules build on ------------------------------------

    def axes(self, mesh: jax.sharding.Mesh | None = None,
             axis: AxisArg = None) -> Axes:
        """Resolve ``mesh`` (default: 1-D over all devices) and ``axis``."""
        return _layout.resolve_axes(
            _devices.default_mesh() if mesh is None else mesh, axis)

    def forms(self, mesh: jax.sharding.Mesh | None = None,
              axis: AxisArg = None) -> dict[str, Callable[..., Any]]:
        """The forms that run on this mesh and axis, and the oracle, as
        callables bound to them."""
        axes = self.axes(mesh, axis)  # a bad mesh or axis fails here, not at the call
        bound = dict(mesh=mesh, axis=axis)
        return {form: functools.partial(getattr(self, form), **bound)
                for form in (*FORMS, "reference")
                if self.unrunnable_form(form, axes) is None}

    def compiled(self, form: str, axes: Axes) -> Callable[..., Any]:
        """The cached jitted callable of the ``"shard_map"``, ``"jit"`` or
        ``"explicit"`` form.

        It takes arrays already placed by :meth:`place` (for the same form),
        so benchmarks and HLO inspection see the collective and nothing else.
        """
        if form not in PLACED_FORMS:
            raise ValueError(
                f"form: expected one of {', '.join(PLACED_FORMS)}, got {form!r}. "
                "The pmap form has no placed-array callable; use Recipe.pmap.")
        return _build(self, form, axes)

    def place(self, *args: Any, axes: Axes, form: str = "shard_map"
              ) -> tuple[Any, ...]:
        """Put global arrays on the mesh with the recipe's input shardings,
        as ``form`` takes them (the jit form on ``Auto`` axes, the explicit
        form on ``Explicit`` axes, shard_map on the mesh as given).

        Raises:
          TypeError, ValueError: as for the forms, for arguments that do not
            fit the recipe's specs.
        """
        self._check_args(args, axes)
        return self._placed(args, axes, form)

    def _placed(self, args: Sequence[Any], axes: Axes, form: str = "shard_map"
                ) -> tuple[Any, ...]:
        mesh = form_mesh(form, axes.mesh)
        specs = self.in_specs(axes)
        return tuple(jax.device_put(arg, _layout.shardings(mesh, spec))
                     for arg, spec in zip(args, specs, strict=True))

    def example_args(self, mesh: jax.sharding.Mesh | None = None,
                     axis: AxisArg = None, *, dtype: Any = "float32",
                     dims: Sequence[int] = DEFAULT_DIMS, seed: int = 0,
                     exact: bool = False) -> tuple[Any, ...]:
        """Valid NumPy arguments for this recipe, for demos and checks.

        Args:
          mesh, axis: as for the forms.
          dtype: the dtype of every argument.
          dims: small positive ints that size the arrays (the recipe
            multiplies them by mesh axis sizes where it shards).
          seed: seed of the NumPy generator.
          exact: draw small integers (exactly representable in every float
            dtype, with exact sums), so every form must match bit for bit.
        """
        axes = self.axes(mesh, axis)
        dims = check_dims(dims)
        rng = np.random.default_rng(seed)
        shapes = self.example_shapes(axes, dims)
        return tuple(jax.tree_util.tree_map(
            lambda shape: random_array(rng, shape, dtype, exact=exact),
            shape_tree, is_leaf=is_shape) for shape_tree in shapes)

    def validated_axes(self, args: Sequence[Any],
                       mesh: jax.sharding.Mesh | None = None,
                       axis: AxisArg = None) -> Axes:
        """Resolve ``mesh`` and ``axis``, and check that the recipe runs over
        them and that ``args`` fit it: the one validation :meth:`run` relies on.

        Raises:
          TypeError, ValueError: a clear message naming the argument, the
            value and the fix.
        """
        axes = self.axes(mesh, axis)
        problem = self.unsupported_reason(axes)
        if problem is not None:
            raise ValueError(
                f"{self.name}: cannot run over mesh {dict(axes.mesh.shape)} with "
                f"axis={axes.axis!r}: {problem}")
        self._check_args(args, axes)
        if self.validate is not None:
            self.validate(axes, args)
        return axes

    def _check_args(self, args: Sequence[Any], axes: Axes) -> None:
        if len(args) != len(self.arg_names):
            names = ", ".join(self.arg_names)
            raise TypeError(
                f"{self.name}: takes {len(self.arg_names)} argument(s) ({names}), got "
                f"{len(args)}. Fix: pass exactly {names}.")
        in_specs = self.in_specs(axes)
        for index, (arg, spec, name) in enumerate(
                zip(args, in_specs, self.arg_names, strict=True)):
            self._check_structure(index, arg, spec, name, axes)
            map_leaves(arg, spec,
                        lambda leaf, s, where: self._check_leaf(leaf, s, where, axes),
                        f"{self.name}: argument {name}")

    def _check_structure(self, index: int, arg: Any, spec: Any, name: str,
                         axes: Axes) -> None:
        """An argument the recipe takes as one array must be one array."""
        if not isinstance(spec, P):
            return  # a spec tree: leaf_specs checks the structure
        try:
            expected = self.example_shapes(axes, DEFAULT_DIMS)[index]
        except Exception:  # a recipe that cannot say: no check
            return
        treedef = jax.tree_util.tree_structure(arg)
        if is_shape(expected) and not (
                treedef.num_leaves == 1 and jax.tree_util.treedef_is_leaf(treedef)):
            raise TypeError(
                f"{self.name}: argument {name} must be one array (e.g. of shape "
                f"{expected}), got {type(arg).__name__} {brief(arg)}, a pytree "
                f"with {treedef.num_leaves} leaves. Fix: pass a NumPy or JAX "
                f"array, e.g. np.asarray({name}).")

    def _check_leaf(self, leaf: Any, spec: P, what: str, axes: Axes) -> None:
        _layout.check_against_spec(what, leaf, spec, axes.mesh)
        shape, dtype = _layout.shape_dtype(leaf)
        kind = dtype_kind(dtype)
        if kind not in self.dtype_kinds:
            hint = ("x.astype(jnp.int32)" if kind == "bool"
                    else "x.real or x.astype(jnp.float32)")
            raise TypeError(
                f"{what} has dtype {dtype}, which {self.name} does not accept; it "
                f"takes {', '.join(sorted(self.dtype_kinds))} arrays. Fix: cast first, "
                f"e.g. {hint}.")
        check_fits_canonical(leaf, dtype, what)
        if 0 in shape:
            raise ValueError(
                f"{what} has shape {shape} with no elements; the forms need at "
                "least one element on every device. Fix: skip the call for empty "
                "inputs.")


def _run_unpacked(recipe: Recipe, form: str, axes: Axes, *args: Any) -> Any:
    return recipe.run(form, args, axes)


@functools.cache
def pmap_callable(recipe: Recipe, axes: Axes) -> Callable[..., Any]:
    """The cached ``jax.pmap`` (nested ``vmap`` for further mesh axes) of the
    recipe's body over ``axes``; it takes :func:`stack_args`'s arguments."""
    mesh = axes.mesh
    names = tuple(mesh.axis_names)
    in_axes = stacked_in_axes(recipe, axes)
    fn = functools.partial(recipe.pmap_body or recipe.body, axis=axes.axis)
    for name in reversed(names[1:]):
        fn = jax.vmap(fn, in_axes=in_axes, axis_name=name)
    first_column = mesh.devices[(slice(None),) + (0,) * (len(names) - 1)]
    return _compat.on_mesh(jax.pmap(fn, axis_name=names[0], in_axes=in_axes,
                            devices=list(first_column)), None)


PLACED_FORMS: tuple[str, ...] = ("shard_map", "jit", "explicit")
"""The forms that run on arrays placed on the mesh (pmap takes stacks)."""


def form_mesh(form: str, mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    """The mesh ``form`` runs on: the jit form on ``Auto`` axes and the
    explicit form on ``Explicit`` axes whatever the caller's mesh says (the
    same devices and names); shard_map on the mesh as given."""
    if form in ("jit", "explicit"):
        return _compat.with_axis_types(mesh, explicit=form == "explicit")
    return mesh


def _resharded(tree: Any, specs: Any) -> Any:
    leaves = _layout.leaf_specs(specs, tree, "outputs")
    values, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, [
        jax.sharding.reshard(value, spec)
        for value, spec in zip(values, leaves, strict=True)])


@functools.cache
def _build(recipe: Recipe, form: str, axes: Axes) -> Callable[..., Any]:
    reason = recipe.unrunnable_form(form, axes)
    if reason:
        raise (RecipeUnavailable if form == "shard_map" else NotImplementedError)(
            f"{recipe.name}: the {form} form does not run on mesh "
            f"{dict(axes.mesh.shape)} axis={axes.axis!r} (JAX {jax.__version__}): "
            f"{reason}")
    in_specs = recipe.in_specs(axes)
    out_specs = recipe.out_specs(axes)
    mesh = form_mesh(form, axes.mesh)
    # the jit and explicit programs see the mesh they run on (its axis
    # types), not the caller's: a program that constrains an intermediate
    # on an Explicit mesh from jax.make_mesh would otherwise fail under jit
    axes_here = dataclasses.replace(axes, mesh=mesh)
    if form == "shard_map":
        fn = jax.jit(jax.shard_map(
            functools.partial(recipe.body, axis=axes.axis), mesh=mesh,
            in_specs=in_specs, out_specs=out_specs, check_vma=recipe.check_vma))
    elif form == "jit":
        fn = jax.jit(
            functools.partial(recipe.program, axes=axes_here),
            in_shardings=_layout.shardings(mesh, in_specs),
            out_shardings=_layout.shardings(mesh, out_specs))
    else:  # explicit: the shardings are in the input types
        program = recipe.explicit_program or recipe.program

        def explicit(*args: Any) -> Any:
            return _resharded(program(*args, axes=axes_here), out_specs)

        explicit.__name__ = f"{recipe.name}_explicit"
        fn = jax.jit(explicit)
    # the explicit program reshards to bare PartitionSpecs: against the mesh
    # in context, so it always runs with its own in scope
    scoped = _compat.on_mesh(fn, mesh, reads_context_mesh=form == "explicit")
    if form == "shard_map" and recipe.family == "kernel":  # bounded in time
        return _kernels.Bounded(scoped, recipe.name)
    return scoped


def clear_caches() -> None:
    """Drop every compiled form this module and JAX keep (``jax.clear_caches``).

    Each new input shape compiles new programs, and both caches keep them for
    the life of the process; long property runs call this between modules to
    keep memory bounded.
    """
    _build.cache_clear()
    pmap_callable.cache_clear()
    jax.clear_caches()
