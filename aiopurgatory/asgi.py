"""Long polls on ASGI (Starlette, FastAPI, ... under uvicorn or hypercorn).

Two helpers, neither depending on any framework:

* :class:`CancelOnDisconnect`, an ASGI middleware giving ASGI apps what aiohttp's
  ``handler_cancellation=True`` gives aiohttp: the handler of an HTTP request runs in
  a task that is cancelled the moment its client disconnects, so that an operation
  it awaits leaves the purgatory at once. Uvicorn and hypercorn only tell the app of
  a disconnect through ``receive()``, which a handler awaiting an operation is not
  calling: without the middleware each client that hangs up leaves its operation
  waiting until its timeout.
* :class:`PurgatoryLifespan`, a lifespan (``Starlette(lifespan=...)``,
  ``FastAPI(lifespan=...)``) that opens a :class:`~aiopurgatory.Purgatory` when the
  app starts and closes it when it stops, optionally as soon as the server is asked
  to stop (``close_on_signals``): servers wait for open requests before they run the
  lifespan's shutdown, so waiting polls would otherwise hold the shutdown up until
  their timeouts.

This module needs no framework and no server; the ``asgi`` extra installs what the
example in ``examples/asgi_long_poll`` runs on (Starlette and uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    MutableMapping,
)
from types import FrameType
from typing import Any

from .purgatory import Purgatory

__all__ = ["ASGIApp", "CancelOnDisconnect", "PurgatoryLifespan", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
"""An ASGI connection scope (``scope["type"]`` is ``"http"``, ``"lifespan"``, ...)."""
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
"""The ASGI ``receive`` callable: the next message from the client or the server."""
Send = Callable[[Message], Awaitable[None]]
"""The ASGI ``send`` callable: a message to the client or the server."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
"""An ASGI 3 application: ``await app(scope, receive, send)``."""

_DISCONNECT: Message = {"type": "http.disconnect"}

_log = logging.getLogger(__name__)


class _Inbox:
    """The messages of one request, read ahead of the app one at a time.

    A watcher task reads the server's ``receive()`` and hands each request message to
    the app, holding at most one that the app has not taken (so a body the app does
    not read is not buffered). Once the body is read, the watcher waits on
    ``receive()`` for ``http.disconnect``.
    """

    __slots__ = ("disconnected", "messages")

    def __init__(self) -> None:
        self.messages: asyncio.Queue[Message] = asyncio.Queue(maxsize=1)
        self.disconnected = False

    async def watch(self, receive: Receive) -> None:
        """Return once the client has disconnected."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected = True
                return
            await self.messages.put(message)

    async def receive(self) -> Message:
        """The app's ``receive``."""
        if self.disconnected and self.messages.empty():
            return dict(_DISCONNECT)
        return await self.messages.get()


class CancelOnDisconnect:
    """ASGI middleware: cancel an HTTP request's handler when its client disconnects.

    ``app = CancelOnDisconnect(app)``, or with Starlette and FastAPI
    ``app.add_middleware(CancelOnDisconnect)``. The handler (the rest of the app)
    runs in a task of its own; a task beside it reads ``receive()`` and cancels the
    handler on ``http.disconnect``. The handler's ``CancelledError`` then unwinds it
    (an awaited operation is cancelled and leaves its purgatory) and the request ends
    without a response, there being nobody to send it to. A request body is passed
    on as the app reads it; a disconnect while the app leaves a body unread is noticed
    once it reads it. Other scopes (``lifespan``, ``websocket``) pass through.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        """The wrapped application."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        inbox = _Inbox()
        handler = asyncio.ensure_future(self.app(scope, inbox.receive, send))
        watcher = asyncio.ensure_future(inbox.watch(receive))
        try:
            await asyncio.wait([handler, watcher], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server cancels the request: both go
            handler.cancel()
            watcher.cancel()
            await asyncio.wait([handler, watcher])
            raise
        disconnected = not handler.done()
        if disconnected:
            handler.cancel()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher  # its error, if any, is the disconnect itself
        try:
            await handler
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if disconnected and (current is None or not current.cancelling()):
                return  # we cancelled it: the client is gone
            raise


SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
"""What servers stop on (uvicorn and hypercorn both)."""


class PurgatoryLifespan:
    """A lifespan opening a purgatory when the app starts and closing it when it stops.

    ``Starlette(routes, lifespan=PurgatoryLifespan("long-poll"))``: the purgatory is
    :attr:`purgatory` (between startup and shutdown) and, in the lifespan state,
    ``request.state.purgatory`` (``state_key``). At shutdown it is closed: every
    operation still waiting fails with :class:`~aiopurgatory.PurgatoryClosed` (answer
    503) and the timer task is awaited.

    ``close_on_signals=True`` closes it as soon as SIGINT or SIGTERM arrives, before
    the server waits for the open requests (which it does before the lifespan's
    shutdown: waiting polls would hold it up until their timeouts). The handlers the
    server installed still run first; with none (``SIG_DFL``), the purgatory closes and
    the signal then takes its default action. A signal set to ``SIG_IGN`` stays
    ignored: no handler is installed for it, and the purgatory closes at the
    lifespan's shutdown only. At shutdown the lifespan puts back the handler it
    replaced if its own is still the one installed (one installed over it since stays,
    and ours then passes signals on without acting): several lifespans may stop in any
    order, and once all have stopped each signal has the disposition it had before the
    first started. Signal handlers can only be set from the main thread: an app
    started on another one (Starlette's and FastAPI's ``TestClient``, a server run in a
    thread) goes on without them, logging so at debug level (``aiopurgatory.asgi``),
    and the purgatory closes at the lifespan's shutdown. ``on_close`` (optional) is
    called when the signal closes it.

    The other keyword arguments (``options``) are the purgatory's: ``observer``,
    ``clock``, ``max_pending``, ... A test can change them for the app's next start
    with :meth:`override`, e.g. to run an app module's lifespan on a
    :class:`~aiopurgatory.testing.ManualClock`.

    A transport that runs no lifespan (``httpx.ASGITransport``) needs
    ``async with lifespan(app):`` around the client: calling the lifespan with the app
    gives the async context manager the frameworks enter.
    """

    def __init__(
        self,
        name: str = "purgatory",
        *,
        state_key: str = "purgatory",
        close_on_signals: bool = False,
        signals: Iterable[signal.Signals] = SIGNALS,
        on_close: Callable[[], None] | None = None,
        **options: Any,
    ) -> None:
        self.name = name
        """The purgatory's name."""
        self.state_key = state_key
        """The key of the purgatory in the lifespan state (``request.state.<key>``)."""
        self.close_on_signals = close_on_signals
        """Whether SIGINT or SIGTERM closes the purgatory at once (main thread only)."""
        self.signals = tuple(signals)
        """The signals that close it, with ``close_on_signals``."""
        self.on_close = on_close
        """Called when a signal closed the purgatory, if given."""
        self.options = options
        """The purgatory's keyword arguments (see :meth:`override`)."""
        self.purgatory: Purgatory | None = None
        """The running app's purgatory: None before the first start; closed after stop."""

    def __call__(self, app: object) -> contextlib.AbstractAsyncContextManager[dict[str, Any]]:
        return self._lifespan()

    @contextlib.contextmanager
    def override(self, **options: Any) -> Iterator[None]:
        """Within the ``with`` block, purgatories made at startup get ``options`` too.

        For tests of an app whose lifespan is built at import::

            with server.lifespan.override(clock=clock), TestClient(server.app):
                ...

        The options are :class:`~aiopurgatory.Purgatory`'s (``clock``, ``observer``,
        ``max_pending``, ...) and replace those given to the constructor; the previous
        ones are back after the block. Raises ``RuntimeError`` while the app runs: its
        purgatory exists already and would not see them.
        """
        if self.running:
            raise RuntimeError(
                f"the lifespan of purgatory {self.name!r} is running: override its"
                " options before the app starts"
            )
        previous = self.options
        self.options = {**previous, **options}
        try:
            yield
        finally:
            self.options = previous

    def current(self) -> Purgatory:
        """The purgatory of the running app.

        Raises ``RuntimeError`` before the app has started or after it stopped (a
        transport that runs no lifespan, such as ``httpx.ASGITransport``, needs
        ``async with lifespan(app):`` around it).
        """
        purgatory = self.purgatory
        if purgatory is None or purgatory.closed:
            raise RuntimeError(
                f"the purgatory {self.name!r} is not running: its lifespan has not started"
                " (or has ended)"
            )
        return purgatory

    async def dependency(self) -> Purgatory:
        """:meth:`current` as a FastAPI dependency: ``Depends(lifespan.dependency)``.

        A coroutine on purpose: FastAPI runs a plain function dependency in its thread
        pool, which costs a thread hop per request and hides the request from
        :meth:`ManualClock.advance <aiopurgatory.testing.ManualClock.advance>`, which
        waits for the loop to go idle but not for threads.
        """
        return self.current()

    @property
    def running(self) -> bool:
        """True between the app's startup and its shutdown."""
        return self.purgatory is not None and not self.purgatory.closed

    @contextlib.asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[dict[str, Any]]:
        purgatory = Purgatory(self.name, **self.options)
        self.purgatory = purgatory
        installed: list[_SignalHandler] = []
        if self.close_on_signals:
            installed = self._install_signal_handlers(purgatory)
        try:
            yield {self.state_key: purgatory}
        finally:
            # Last installed first: a signal listed twice unwinds to what was there.
            for handler in reversed(installed):
                handler.uninstall()
            await purgatory.aclose()

    def _install_signal_handlers(self, purgatory: Purgatory) -> list[_SignalHandler]:
        """Chain our handler after the one in place, per signal; the handlers installed.

        Nothing over ``SIG_IGN`` (an ignored signal stays ignored) nor over a handler
        set outside Python (``getsignal`` gives None: it could not be put back); and
        nothing at all, with a debug line, off the main thread, where ``signal.signal``
        raises ``ValueError``.
        """
        loop = asyncio.get_running_loop()

        def close() -> None:
            if not purgatory.closed:
                purgatory.close()
                if self.on_close is not None:
                    self.on_close()

        installed: list[_SignalHandler] = []
        for signum in self.signals:
            previous = signal.getsignal(signum)
            if previous is None or previous == signal.SIG_IGN:
                continue
            handler = _SignalHandler(signum, previous, loop, close)
            try:
                signal.signal(signum, handler)
            except ValueError as exc:  # not the main thread of the main interpreter
                for done in reversed(installed):
                    done.uninstall()
                _log.debug(
                    "purgatory %r: close_on_signals goes on without signal handlers (%s);"
                    " it closes at the lifespan's shutdown",
                    purgatory.name,
                    exc,
                )
                return []
            installed.append(handler)
        return installed


class _SignalHandler:
    """One lifespan's handler of one signal, chained to the disposition it replaced.

    Lifespans may stop in any order, so the handler a lifespan replaced may belong to
    one that stopped since: both :meth:`__call__` and :meth:`uninstall` look through
    the handlers of stopped lifespans (or of closed loops) to the first live
    disposition under them. A stopped handler that something else still calls (a
    handler installed over ours, chaining to it) passes the signal down in the same
    way, and never touches its loop.
    """

    __slots__ = ("close", "loop", "previous", "signum", "stopped")

    def __init__(
        self,
        signum: signal.Signals,
        previous: Callable[[int, FrameType | None], Any] | int,
        loop: asyncio.AbstractEventLoop,
        close: Callable[[], None],
    ) -> None:
        self.signum = signum
        self.previous = previous
        self.loop = loop
        self.close = close
        self.stopped = False

    @property
    def live(self) -> bool:
        return not self.stopped and not self.loop.is_closed()

    def below(self) -> Callable[[int, FrameType | None], Any] | int:
        """The disposition a signal goes on to: the nearest one not of a stopped
        lifespan."""
        previous = self.previous
        while isinstance(previous, _SignalHandler) and not previous.live:
            previous = previous.previous
        return previous

    def uninstall(self) -> None:
        """Stop; put back what was below if ours is still the signal's handler (if
        another was installed over it, that one stays, and ours passes signals down)."""
        self.stopped = True
        ours = signal.getsignal(self.signum) is self  # a bool: `is self` narrows self
        if ours:
            signal.signal(self.signum, self.below())

    def __call__(self, number: int, frame: FrameType | None) -> None:
        previous = self.below()
        if not self.live:
            _pass_down(previous, number, frame)
            return
        if callable(previous):
            try:
                previous(number, frame)
            finally:  # even if it raised (SIGINT's KeyboardInterrupt): the server is stopping
                self.loop.call_soon_threadsafe(self.close)
        elif previous == signal.SIG_DFL:
            # Nobody handled it: close, then its default action (terminate), that last
            # from the loop so that the purgatory closes first.
            signal.signal(number, signal.SIG_DFL)
            self.loop.call_soon_threadsafe(self.close)
            self.loop.call_soon_threadsafe(signal.raise_signal, number)
        # (SIG_IGN is never below one of ours: none is installed over it.)


def _pass_down(
    disposition: Callable[[int, FrameType | None], Any] | int, number: int, frame: FrameType | None
) -> None:
    """Act on a signal as ``disposition`` would have if ours were not in the way."""
    if callable(disposition):
        disposition(number, frame)
    elif disposition == signal.SIG_DFL:
        signal.signal(number, signal.SIG_DFL)
        signal.raise_signal(number)
