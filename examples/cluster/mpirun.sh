#!/bin/bash
# Open MPI: `mpirun` starts one rank per slot; every rank runs `collectives worker`.
#
# Change: NP (ranks), HOSTS (hosts and slots), IFACE (the network interface
# the ranks reach each other on), the target after `--`.
# Run: NP=2 HOSTS=host0:1,host1:1 IFACE=eth0 bash examples/cluster/mpirun.sh
# Try it on one machine (CPU only, 2 ranks x 4 simulated devices, loopback):
#   NP=2 HOSTS=localhost:2 IFACE=lo CPU_DEVICES=4 bash examples/cluster/mpirun.sh
#
# Which JAX detects what:
#   * Open MPI < 5 (ORTE, sets OMPI_MCA_orte_hnp_uri): every supported JAX;
#   * Open MPI 5 (PRRTE): JAX >= 0.11.2 with mpi4py installed. On older JAX,
#     or without mpi4py, every rank stops at once with an error naming the
#     OMPI_* variables it saw (it never runs alone); name the job by hand
#     instead, e.g. --coordinator host0:61234 --num-processes 2
#     --process-id "$OMPI_COMM_WORLD_RANK" (run through `bash -c` so each
#     rank expands its own rank).
# JAX takes the coordinator's address from Open MPI's out-of-band URI
# (OMPI_MCA_orte_hnp_uri), whose first address is on the interface that
# `--mca oob_tcp_if_include` names: IFACE chooses where rank 0 listens
# (`lo` keeps everything on 127.0.0.1). The coordinator's port is derived
# from the job id; to choose one, set JAX_COORDINATOR_PORT and add
# `-x JAX_COORDINATOR_PORT` (likewise `-x PYTHONPATH` if the package is
# found through it). Running as root also needs --allow-run-as-root.
#
# Expected output, from rank 0 after its own table (checked by CI, which runs
# this file on one machine with Open MPI 4.1.4):
#   rank  host             status   exit  seconds  summary
#   0     host0            ok          0     75.3  137 agree, 0 disagree, 21 skipped
#   1     host1            ok          0     75.3  137 agree, 0 disagree, 21 skipped
#   ok: all 2 ranks passed
# and exit code 0 (non-zero from every rank if any rank failed). A rank that
# is killed or sent SIGTERM ends the job within seconds, with an error naming
# it.
set -euo pipefail

NP=${NP:-2}
HOSTS=${HOSTS:-host0:1,host1:1}
# CPU-only hosts: set CPU_DEVICES (simulated devices per rank); on GPU hosts
# leave it unset (each rank uses the GPU of its local rank).
mpirun -np "$NP" --host "$HOSTS" -x PATH \
    ${IFACE:+--mca oob_tcp_if_include "$IFACE" --mca btl_tcp_if_include "$IFACE"} \
    ${MPIRUN_OPTIONS:-} \
    python -m collectives worker ${CPU_DEVICES:+--cpu-devices "$CPU_DEVICES"} \
    --log-dir "${LOG_DIR:-logs}" \
    -- check
