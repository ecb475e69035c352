#!/bin/bash
# Open MPI: `mpirun` starts one rank per slot; every rank runs `collectives worker`.
#
# Change: -np (ranks), --host (hosts and slots), the target after `--`.
# Run: bash examples/cluster/mpirun.sh
#
# Which JAX detects what:
#   * Open MPI < 5 (ORTE, sets OMPI_MCA_orte_hnp_uri): every supported JAX;
#   * Open MPI 5 (PRRTE): JAX >= 0.11.2 with mpi4py installed. On older JAX,
#     or without mpi4py, every rank stops at once with an error naming the
#     OMPI_* variables it saw (it never runs alone); name the job by hand
#     instead, e.g. --coordinator host0:61234 --num-processes 2
#     --process-id "$OMPI_COMM_WORLD_RANK" (run through `bash -c` so each
#     rank expands its own rank).
# The coordinator runs on the host of rank 0, on a port derived from the job
# id; to choose one, set JAX_COORDINATOR_PORT and add `-x JAX_COORDINATOR_PORT`
# (likewise `-x PYTHONPATH` if the package is found through it).
#
# Expected output, from rank 0 after its own table:
#   rank  host             status   exit  seconds  summary
#   0     host0            ok          0     38.0  105 agree, 0 disagree
#   1     host1            ok          0     38.0  105 agree, 0 disagree
#   ok: all 2 ranks passed
# and exit code 0 (non-zero from every rank if any rank failed).
set -euo pipefail

NP=${NP:-2}
HOSTS=${HOSTS:-host0:1,host1:1}

# CPU-only hosts: keep --cpu-devices (simulated devices per rank); on GPU
# hosts drop it (each rank uses the GPU of its local rank).
mpirun -np "$NP" --host "$HOSTS" -x PATH \
    python -m collectives worker --cpu-devices 4 --log-dir logs \
    -- check
