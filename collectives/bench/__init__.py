"""An nccl-tests-style benchmark of every collective in every form.

``python -m collectives bench`` sweeps buffer sizes (``-b 8 -e 64M -f 2``, as
nccl-tests' ``all_reduce_perf``) and, for each collective and form (pmap,
shard_map, jit, and the ring built from ``ppermute`` where one exists),
prints one row:

* ``size`` and ``count``: ``S`` in bytes and elements, by nccl-tests'
  convention (the buffer per device for all-reduce, all-to-all and permute;
  the whole gathered output for all-gather; the whole unscattered input for
  reduce-scatter);
* ``iters``: collectives run inside one compiled call (a ``fori_loop`` with a
  runtime trip count), so dispatch is amortised out of the figure; picked
  to make a call last ``--min-time`` unless ``-n`` fixes it;
* ``time``: the median over the timed calls of call time / ``iters``, and
  ``±95%``: the half-width of its 95 % bootstrap interval over the median.
  Calls are taken (at least ``-r``) until every interval is within
  ``--precision`` (2 %) or ``--budget`` seconds are spent;
* ``algbw = S / time`` and ``busbw = algbw * factor`` with nccl-tests'
  factors (all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and
  all-to-all ``(n-1)/n``; permute 1), in GB/s (1e9 bytes per second);
* ``busbw/copy``: busbw over the bandwidth of a memcpy-style pass over the
  same ``S`` bytes on every device, measured in the same run (the ``copy``
  rows): on simulated CPU devices a collective is memory traffic, so the copy
  is its practical limit;
* ``args``, ``out``, ``temp``: the per-device argument, output and temporary
  bytes of the form's compiled program (:func:`memory_per_device`);
* ``#wrong``: elements that differ from the NumPy oracle, counted on every
  device's copy of the output after one collective (nccl-tests' check).

After the rows, the alpha-beta cost model fitted per collective and form
(``time = alpha + beta * S * factor``, with intervals and the model's error).
``--json FILE`` writes everything with the versioned schema :data:`SCHEMA`
(``schema.json``), ``--csv FILE`` the rows; ``--plot FILE`` draws busbw
against size with the intervals as bands (needs matplotlib: the ``bench``
extra). ``--overhead`` measures ratios instead: recipe shard_map form / bare
``shard_map(lax.<op>)``, jit / shard_map and pmap with host input / device
input, with the calls interleaved so drift cancels; each ratio gets a 95 %
interval and a verdict against its target: *met*, *not met* or
*inconclusive*.

Examples:
  >>> from collectives.bench import parse_size, size_sweep
  >>> parse_size("64M"), parse_size("1K"), parse_size("8")
  (67108864, 1024, 8)
  >>> size_sweep(1024, 16384, 4)
  [1024, 4096, 16384]
"""

from collectives.bench._cases import BENCH_FORMS
from collectives.bench._cases import DEFAULT_COLLECTIVES
from collectives.bench._command import add_arguments
from collectives.bench._command import main
from collectives.bench._memory import memory_per_device
from collectives.bench._schema import SCHEMA
from collectives.bench._schema import schema_errors
from collectives.bench._sweep import parse_size
from collectives.bench._sweep import run
from collectives.bench._sweep import size_sweep

__all__ = ["BENCH_FORMS", "DEFAULT_COLLECTIVES", "SCHEMA", "add_arguments", "main",
           "memory_per_device", "parse_size", "run", "schema_errors", "size_sweep"]
