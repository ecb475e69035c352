"""collectives: JAX cross-device collectives in pmap, shard_map and jit form.

Every recipe runs as legacy ``jax.pmap``, as ``jax.shard_map`` and as
``jax.jit`` over ``NamedSharding`` arrays, on global-view arrays, and is
checked against a NumPy oracle.

Examples:
  >>> import numpy as np
  >>> import collectives as cx
  >>> mesh = cx.make_mesh((8,), "i")
  >>> r = cx.RECIPES["psum"]
  >>> x = np.arange(16.0).reshape(8, 2)
  >>> np.asarray(r.shard_map(x, mesh=mesh))
  array([[56., 64.]], dtype=float32)
  >>> bool(np.array_equal(r.pmap(x, mesh=mesh), r.reference(x, mesh=mesh)))
  True
"""

import sys as _sys

from collectives import _interrupt

if _interrupt.run_as_command(_sys.orig_argv):
    from collectives import _environment

    _interrupt.at_startup(_sys.orig_argv)  # Ctrl-C during the imports below
    # what JAX and XLA read as they start: one line each, before they fail
    _environment.refuse_bad_environment(_interrupt.command_name(_sys.orig_argv))

from collectives import _facts  # noqa: F401  (registers every recipe, in order)
from collectives._check import CheckResult
from collectives._check import check
from collectives._devices import make_mesh
from collectives._devices import use_cpu_devices
from collectives._diagram import Diagram
from collectives._diagram import diagram
from collectives._facts.all_to_all_attention import all_to_all_attention
from collectives._facts.collective_matmul import allgather_matmul
from collectives._facts.collective_matmul import matmul_reduce_scatter
from collectives._facts.dp_grads import tree_pmean
from collectives._facts.dp_tp_mlp import dp_tp_mlp_value_and_grad
from collectives._facts.dp_tp_mlp import init_mlp
from collectives._facts.dp_tp_mlp import mlp_loss
from collectives._facts.dp_tp_mlp import mlp_specs
from collectives._facts.fsdp import fsdp_specs
from collectives._facts.fsdp import fsdp_value_and_grad
from collectives._facts.fsdp import gather_layer
from collectives._facts.halo_exchange import halo_exchange
from collectives._facts.moe import moe_layer
from collectives._facts.moe import moe_layer_dropless
from collectives._facts.monte_carlo import chain_keys
from collectives._facts.monte_carlo import device_key
from collectives._facts.pipeline import bubble_fraction
from collectives._facts.pipeline import pipeline_reference
from collectives._facts.pipeline import pipeline_value_and_grad
from collectives._facts.ppermute import check_permutation
from collectives._facts.ppermute import permute
from collectives._facts.ppermute import ring_shift
from collectives._facts.ring_algorithms import ring_all_gather
from collectives._facts.ring_algorithms import ring_all_reduce
from collectives._facts.ring_algorithms import ring_reduce_scatter
from collectives._facts.ring_attention import ring_attention
from collectives._facts.vmap_batching import vmap_axes
from collectives._facts.vmap_batching import vmap_form
from collectives._kernels import KernelTimeout
from collectives._layout import Axes
from collectives._layout import ReplicationError
from collectives._memory import compiled_memory
from collectives._memory import device_bytes
from collectives._parallelism import StrategyRow
from collectives._parallelism import strategy_table
from collectives._presentation import BenchSpec
from collectives._presentation import DiagramSpec
from collectives._presentation import PlanSpec
from collectives._presentation import UnitBoundary
from collectives._recipe import FAMILIES
from collectives._recipe import FORMS
from collectives._recipe import Recipe
from collectives._recipe import RecipeUnavailable
from collectives._recipe import UnsupportedDtypeError
from collectives._registry import RECIPES
from collectives.hlo import CollectiveStats
from collectives.hlo import collective_stats

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "FORMS",
    "RECIPES",
    "Axes",
    "BenchSpec",
    "CheckResult",
    "CollectiveStats",
    "Diagram",
    "DiagramSpec",
    "KernelTimeout",
    "PlanSpec",
    "Recipe",
    "RecipeUnavailable",
    "ReplicationError",
    "StrategyRow",
    "UnitBoundary",
    "UnsupportedDtypeError",
    "all_to_all_attention",
    "allgather_matmul",
    "bubble_fraction",
    "chain_keys",
    "check",
    "check_permutation",
    "collective_stats",
    "compiled_memory",
    "device_bytes",
    "device_key",
    "diagram",
    "dp_tp_mlp_value_and_grad",
    "fsdp_specs",
    "fsdp_value_and_grad",
    "gather_layer",
    "halo_exchange",
    "init_mlp",
    "make_mesh",
    "matmul_reduce_scatter",
    "mlp_loss",
    "mlp_specs",
    "moe_layer",
    "moe_layer_dropless",
    "permute",
    "pipeline_reference",
    "pipeline_value_and_grad",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_attention",
    "ring_reduce_scatter",
    "ring_shift",
    "strategy_table",
    "tree_pmean",
    "use_cpu_devices",
    "vmap_axes",
    "vmap_form",
]
