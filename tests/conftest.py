"""Shared test set-up: the slow marker, the real-data folder, the project root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The real benchmark data lives beside the checkout (../shared/data); LINKER_SHARED_DATA overrides it.
SHARED_DATA = Path(os.environ.get("LINKER_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow (CI does so by default)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Slow tests run in CI (CI=true) and with --runslow; locally the default run stays fast.
    if config.getoption("--runslow") or os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (CI runs it)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (set LINKER_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES
