"""``guides/multi_process.py``: the recipe file runs as two processes of four
devices under the package's launcher, and inside a rank whose cluster cannot
be joined it fails loudly instead of running alone. (Every recipe across
processes: tests/test_distributed.py and tests/test_launchers.py.)"""

import subprocess
import sys

import pytest

from collectives import distributed
from helpers import GUIDES_DIR
from helpers import rank_env


@pytest.mark.multiprocess
def test_recipe_file_runs_under_the_launcher():
    result = distributed.launch(
        ["python", str(GUIDES_DIR / "multi_process.py")], num_processes=2,
        devices_per_process=4, echo="none")
    assert result.ok, result.report()
    for process in result.processes:
        assert "ok: pmap, shard_map and jit agree with NumPy on 2 processes" in (
            process.output), process.output
        assert f"process {process.index} of 2: 4 of 8 devices" in process.output


def test_the_recipe_file_never_falls_back_silently():
    env = {**rank_env(), "OMPI_VERSION": "5.0.3", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    result = subprocess.run([sys.executable, str(GUIDES_DIR / "multi_process.py")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0, result.stdout
    assert "OMPI_COMM_WORLD_SIZE=2" in result.stderr
    assert "ok:" not in result.stdout
