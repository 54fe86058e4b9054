"""Operations the tests share."""

from __future__ import annotations

from collections.abc import Callable

import aiopurgatory as ap


class Flag(ap.DelayedOperation[str]):
    """Completes when ``ready`` is set; records every hook call."""

    def __init__(self, timeout: float | None, ready: Callable[[], bool] = lambda: False) -> None:
        super().__init__(timeout)
        self.ready = ready
        self.checks = 0
        self.completions = 0
        self.expirations = 0

    def try_complete(self) -> bool:
        self.checks += 1
        return self.ready() and self.force_complete()

    def on_complete(self) -> str:
        self.completions += 1
        return "expired" if self.expired else "done"

    def on_expiration(self) -> None:
        assert self.expired, "on_expiration before expired was set"
        assert self.completions == 1, "on_expiration before on_complete"
        self.expirations += 1
