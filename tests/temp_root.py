"""Where the tests' temporary directories live: in RAM (/dev/shm) when the machine has it.

The SQLite and DuckDB files of the tests (ledgers, stores, Spark's Parquet) are written and
committed thousands of times in a run, and each commit there ends in an fsync: about 8 ms on
this machine's disk under a full run's load, nothing on tmpfs. No test asserts anything about
durability across a power loss, so the files' contents, locks and permissions are what they
would be on disk. Measured on tests/core/test_ledger.py and tests/core/test_release_keys.py (their
SQLite and DuckDB cases, one process, load 9): 66 s with /tmp on disk, 50 s with /dev/shm.

pytest's own temporary root is moved (PYTEST_DEBUG_TEMPROOT, read by its tmp_path factory; it
keeps the last three runs' directories there, a few MB each). TMPDIR or PYTEST_DEBUG_TEMPROOT
set by the caller, or a --basetemp, are left as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

RAM = Path("/dev/shm")


def pytest_configure(config: pytest.Config) -> None:
    chosen = ("TMPDIR", "PYTEST_DEBUG_TEMPROOT")
    if config.option.basetemp or any(os.environ.get(name) for name in chosen):
        return
    if RAM.is_dir() and os.access(RAM, os.W_OK | os.X_OK):
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(RAM)
