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


def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (minutes each) run only with RUN_LONG=1, so `python -m pytest` stays near 15 minutes on
    2 cores; `.ci/run` runs them in a second step."""
    if os.environ.get("RUN_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="takes minutes: run with RUN_LONG=1 (as .ci/run does)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
