"""Every async test runs on asyncio's default loop and on uvloop (anyio's plugin)."""

from __future__ import annotations

from typing import Any

import pytest
import uvloop


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        pytest.param(("asyncio", {"loop_factory": uvloop.new_event_loop}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    backend: tuple[str, dict[str, Any]] = request.param
    return backend
