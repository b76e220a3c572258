"""Shared test fixtures.

`shared_data` points at the project's corpora in `../shared/data` when they are present (a developer's or CI's
checkout) and skips with a clear reason when they are not (a user's clone has no `../shared`).
"""
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHARED_DATA = pathlib.Path(os.environ.get("SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared corpora not found at {SHARED_DATA} (set SHARED_DATA to use them)")
    return SHARED_DATA
