"""Every recipe, registered in the order :data:`collectives.RECIPES` lists them.

Importing this package imports each recipe module once, in the order below:
the core collectives first (their names are a contract), then the patterns
built from them, then the parallelism strategies. That order is the
registry's order; a new recipe module is added here, and nowhere else.
"""
# ruff: noqa: I001  (the import order is the registration order)

# The core collectives, in contract order.
from collectives._facts import reduce  # psum pmean pmax pmin
from collectives._facts import gather  # all_gather(_stacked) psum_scatter
from collectives._facts import all_to_all  # all_to_all
from collectives._facts import permute  # ppermute_ring axis_index

# Patterns built from the collectives.
from collectives._facts import ring
from collectives._facts import halo
from collectives._facts import matmul
from collectives._facts import mlp
from collectives._facts import grads
from collectives._facts import batching
from collectives._facts import montecarlo

# Parallelism strategies.
from collectives._facts import training
from collectives._facts import fsdp
from collectives._facts import pipeline
from collectives._facts import attention
from collectives._facts import moe

__all__ = [
    "all_to_all", "attention", "batching", "fsdp", "gather", "grads", "halo",
    "matmul", "mlp", "moe", "montecarlo", "permute", "pipeline", "reduce", "ring",
    "training"]
