"""Running kernel code once per instruction-set path this CPU has (LLMFLEET_INT_KERNELS forces each, in a
subprocess, since the path is chosen once per process), for the kernel tests' every-path checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from worker.engine.kernels.simd_int import PATHS, supported_paths

REPO = Path(__file__).resolve().parents[2]
_WRAPPER = (
    "import sys, numpy as np\n"
    "from worker.engine.kernels.simd_int import int_path\n"
    "assert int_path() == sys.argv[1], int_path()\n"
    "{body}\n"
    "np.savez(sys.argv[2], *outputs)\n"
)


def outputs_on_every_path(tmp_path: Path, body: str) -> dict[str, list[np.ndarray]]:
    """The arrays `body` (Python code that sets `outputs`, a list of arrays) computes on each path this CPU has."""
    results = {}
    for path in supported_paths():
        target = tmp_path / f"{path}.npz"
        env = {**os.environ, "LLMFLEET_INT_KERNELS": path, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, "-c", _WRAPPER.format(body=body), path, str(target)], cwd=REPO, env=env,
                       check=True, timeout=600)
        with np.load(target) as saved:
            results[path] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return results


def assert_every_path_gives(results: dict[str, list[np.ndarray]], expected: list[np.ndarray]) -> None:
    """Each path's arrays equal `expected` bit for bit; then a skip naming the paths this CPU lacks, if any."""
    for path, arrays in results.items():
        assert len(arrays) == len(expected), path
        for got, want in zip(arrays, expected):
            np.testing.assert_array_equal(got, want, err_msg=path)
    skipped = [path for path in PATHS if path not in supported_paths()]
    if skipped:
        pytest.skip(f"this CPU lacks the {', '.join(skipped)} path: checked only {', '.join(supported_paths())}")
