"""Multi-process: the same collectives when each process loads its own data.

What it shows: with JAX's distributed runtime (one process per host, joined
by ``jax.distributed.initialize``) a mesh spans the devices of every process
and collectives cross process boundaries unchanged: the per-device body
below is the one you would write for a single process. What changes is the
data. Each process loads only the rows its own devices hold;
``jax.make_array_from_process_local_data`` assembles the global array from
those pieces, and ``multihost_utils.process_allgather`` brings a result back
to every process (``np.asarray`` refuses an array that spans processes).

Which form when: shard_map and jit take the global array built from
process-local pieces; pmap (legacy) takes each process's own stack of blocks
and maps over every device of every process.

How to start it:
  * several processes on one machine (CPU devices, gloo over 127.0.0.1):
    ``python -m collectives launch -n 2 --devices-per-process 4 --
    python guides/multi_process.py``;
  * on a cluster, one copy per host (``srun``, ``mpirun``, a Kubernetes
    Job...): ``jax.distributed.initialize()`` finds the processes itself; if
    cluster variables are set but JAX cannot join (e.g. Open MPI 5 before JAX
    0.11.2), it stops with an error instead of running alone;
  * plainly, ``python guides/multi_process.py``: one process with 8
    simulated devices runs the very same code (``jax.process_count() == 1``).

Devices: 8 in all: 2 processes x 4 simulated CPU devices under the launcher,
or 1 process x 8 when run plainly.
JAX versions checked: 0.8.0, 0.10.2, 0.12.0.
Run: ``python guides/multi_process.py``
"""

import os

import jax
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N_DEVICES = 8  # when no launcher or cluster starts several processes
ROWS_PER_DEVICE = 2
COLUMNS = 3


# [start:initialize]
# Variables that say "you are one of several processes" (SLURM, Open MPI,
# other MPIs, or set by hand).
CLUSTER_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                     "OMPI_MCA_orte_hnp_uri", "JAX_COORDINATOR_ADDRESS")


def initialize():
    # Under a launcher the process may already be joined; on SLURM, Open MPI,
    # Kubernetes or Cloud TPU, initialize() detects the cluster by itself.
    if jax.distributed.is_initialized():
        return
    seen = {k: os.environ[k] for k in CLUSTER_VARIABLES
            if os.environ.get(k, "1") != "1"}  # a count of 1 is a single process
    try:
        jax.distributed.initialize()
    except (ValueError, RuntimeError) as err:
        if seen:  # one of several, but JAX cannot join them: never run alone
            named = ", ".join(f"{k}={v}" for k, v in seen.items())
            raise RuntimeError(
                f"cluster variables {named} are set, but JAX {jax.__version__} "
                f"could not join the other processes ({err}). Fix: start with "
                "srun under SLURM; Open MPI 5 needs JAX >= 0.11.2 and mpi4py; "
                "or pass coordinator_address, num_processes and process_id."
            ) from err
        if "coordinator_address" not in str(err):
            raise
        print("no launcher or cluster: one process, "
              f"{N_DEVICES} simulated CPU devices")
        # Simulated CPU devices, on a GPU machine too, unless $JAX_PLATFORMS
        # names a platform.
        jax.config.update("jax_platforms", os.environ.get("JAX_PLATFORMS", "cpu"))
        jax.config.update("jax_num_cpu_devices", N_DEVICES)
# [end:initialize]


# [start:load]
def load_rows(start, stop):
    # Stand-in for reading rows start..stop of a dataset: small integers,
    # exact in float32, so every form must match NumPy bit for bit.
    rows = np.arange(start, stop)[:, None]
    cols = np.arange(COLUMNS)[None, :]
    return ((rows * 7 + cols * 3) % 17 - 8).astype(np.float32)


def load_process_rows():
    # This process feeds jax.local_device_count() devices, ROWS_PER_DEVICE
    # rows each. Meshes built from jax.devices() list each process's devices
    # together, process 0 first, so its rows are one contiguous range.
    n_rows = jax.local_device_count() * ROWS_PER_DEVICE
    start = jax.process_index() * n_rows
    return load_rows(start, start + n_rows), start
# [end:load]


# [start:global]
def global_batch(local, mesh):
    # local: [n_local*k, d] on this process -> global [n*k, d], rows over "i"
    sharding = NamedSharding(mesh, P("i"))
    shape = (jax.process_count() * local.shape[0], local.shape[1])
    return jax.make_array_from_process_local_data(sharding, local, shape)


def to_host(tree):
    # The whole value of each array, as NumPy, on every process.
    return multihost_utils.process_allgather(tree, tiled=True)
# [end:global]


def per_device(block):
    # block: [k, d] on each device -> two [d] results, the same on every device
    return lax.psum(block.sum(0), "i"), lax.pmax(block.max(0), "i")


# [start:pmap]
def column_stats_pmap(local):
    # local: [n_local*k, d] -> [n_local, k, d], one block per local device.
    # pmap maps over every device of every process: psum and pmax cross them.
    stacked = local.reshape(jax.local_device_count(), -1, local.shape[-1])
    total, top = jax.pmap(per_device, axis_name="i")(stacked)
    # Each local device holds a copy: [n_local, d]. Check instead of trusting.
    total, top = np.asarray(total), np.asarray(top)
    assert (total == total[0]).all() and (top == top[0]).all(), "copies differ"
    return total[0], top[0]
# [end:pmap]


# [start:shard_map]
def column_stats_shard_map(x, mesh):
    # x: global [n*k, d] built from process-local rows; the body is unchanged.
    f = jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P())
    return to_host(jax.jit(f)(x))
# [end:shard_map]


# [start:jit]
def column_stats_jit(x, mesh):
    # The global program; XLA inserts the all-reduces across processes.
    f = jax.jit(lambda x: (x.sum(0), x.max(0)),
                out_shardings=NamedSharding(mesh, P()))
    return to_host(f(x))
# [end:jit]


# [start:numpy]
def column_stats_numpy(x):
    return x.astype(np.float64).sum(0), x.max(0)
# [end:numpy]


def main():
    initialize()
    mesh = jax.make_mesh((jax.device_count(),), ("i",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    local, start = load_process_rows()
    x = global_batch(local, mesh)
    want = column_stats_numpy(load_rows(0, x.shape[0]))  # only a check reads it all
    results = {"pmap": column_stats_pmap(local),
               "shard_map": column_stats_shard_map(x, mesh),
               "jit": column_stats_jit(x, mesh)}
    for form, got in results.items():
        for what, value, expected in zip(("sum", "max"), got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(value), expected,
                                          err_msg=f"column {what} ({form} form)")
    np.testing.assert_array_equal(to_host(x), load_rows(0, x.shape[0]))
    me, count = jax.process_index(), jax.process_count()
    print(f"process {me} of {count}: {jax.local_device_count()} of "
          f"{jax.device_count()} devices, loaded rows {start}..{start + len(local)}"
          f" of {x.shape[0]}")
    print("column sums ->", np.asarray(results["shard_map"][0]).tolist())
    where = (f"{count} processes" if count > 1 else
             "1 process (start it with a launcher for several)")
    print(f"ok: pmap, shard_map and jit agree with NumPy on {where}")


if __name__ == "__main__":
    main()
