"""Fixtures of the herald_client tests: a real ``herald serve`` against the provider test
gateways (Tests/reliability/herald_fixtures.py, Tests/gateways/gateways.py), all on loopback.

The package is imported from this tree (src/); test_install.py checks that pip installs it.
The daemon is $HERALD_BIN, else <repo>/.build/debug/herald.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parents[1]
sys.path.insert(0, str(PACKAGE / "src"))
sys.path.insert(0, str(REPO / "Tests" / "reliability"))
os.environ.setdefault("HERALD_BIN", str(REPO / ".build" / "debug" / "herald"))

from herald_fixtures import Daemon, Gateways  # noqa: E402


@pytest.fixture(scope="session")
def gateways() -> Iterator[Gateways]:
    gw = Gateways.shared()
    yield gw


@pytest.fixture(scope="module")
def daemon(gateways: Gateways) -> Iterator[Daemon]:
    """One daemon per test module, configured for APNs, FCM and Web Push against the gateways,
    with a second app (``other``) that has no credentials."""
    d = Daemon(gateways=gateways, apps="[app.other]\ndevice_cap = 5\n")
    try:
        yield d
    finally:
        d.cleanup()


@pytest.fixture()
def gw(gateways: Gateways) -> Iterator[Gateways]:
    """The gateways with no programs, knobs or records left from an earlier test."""
    gateways.reset()
    yield gateways
    gateways.reset()
