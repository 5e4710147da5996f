"""Fixtures shared by the integration tests (the root conftest starts nats-server and Postgres)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from corral.bus import Bus


@pytest.fixture
async def bus(nats_url: str, namespace: str) -> AsyncIterator[Bus]:
    """A bus on the test's namespace, its streams created (a test module may define its own)."""
    b = await Bus.connect(nats_url, namespace=namespace)
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()
