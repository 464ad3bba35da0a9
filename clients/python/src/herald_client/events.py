"""Herald's event stream (``events.subscribe``) as an iterator that resumes by cursor.

A subscribed connection receives ``events`` notifications, each a batch of event objects with
a ``cursor``. ``EventStream`` reads them on a connection of its own and yields the events one by
one, remembering the cursor of the last one it yielded. When the connection ends (a daemon
restart) it connects again, with backoff, and subscribes ``since`` that cursor; when the daemon
says the reader fell behind (a ``gap`` event, reason ``slow``) it subscribes again from the gap's
cursor. Either way the caller misses nothing (an event may come twice: delivery is at least
once). A ``gap`` with reason ``retention`` (events purged before they could be read, nothing to
replay) is yielded to the caller like any event.
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import time
from collections.abc import Iterable
from typing import Any

from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    Overloaded,
    ProtocolError,
    RPCError,
    StoreUnavailable,
    error_from_response,
)
from .types import Event, EventKind

__all__ = ["EventStream"]

_READ_CHUNK = 256 * 1024
#: The cursor before every event (on both stores): a subscription from it reads all that is kept.
_FIRST = "0"


class EventStream:
    """Herald's events, oldest first, as ``dict``s (``Client.events`` makes one)::

        with herald.events(kinds=["delivery"], since=saved_cursor) as stream:
            for event in stream:
                handle(event)
                save(stream.cursor)

    The stream subscribes when it is made (``ConnectFailed``, or the ``RPCError`` of a refused
    ``events.subscribe``: an unknown kind or app, a cursor that is not one). ``since`` is a
    cursor from an earlier event; None starts from now. ``cursor`` is where the stream stands:
    the cursor of the last event yielded, or where the subscription started; give it as
    ``since`` to a later stream to go on from there.

    Iteration blocks until an event comes. With ``idle_timeout`` (seconds) it ends
    (``StopIteration``) when none came for that long; iterating again goes on where it stopped.
    A lost connection is made again at once, then after 0.05 s, twice as long each time up to
    ``max_backoff`` seconds, for as long as it takes, and subscribed ``since`` the cursor. An
    error answer to that subscription is raised (an ``Overloaded`` or ``StoreUnavailable`` one is
    tried again). One stream is for one thread."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        app: str | None = None,
        kinds: Iterable[EventKind] | None = None,
        since: str | None = None,
        idle_timeout: float | None = None,
        connect_timeout: float | None = 5.0,
        timeout: float | None = 10.0,
        max_backoff: float = 2.0,
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.app = app
        self.kinds = None if kinds is None else list(kinds)
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_backoff = max_backoff
        #: The cursor of the last event yielded, or where the subscription started.
        self.cursor: str | None = since
        #: Subscriptions made again after a lost connection or a ``slow`` gap.
        self.resubscribed = 0
        self._sock: socket.socket | None = None
        self._in = bytearray()
        self._events: collections.deque[Event] = collections.deque()
        self._closed = False
        self._subscribe(since)

    def __repr__(self) -> str:
        return f"<herald_client.EventStream {self.socket_path} cursor={self.cursor!r}>"

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> EventStream:
        return self

    def close(self) -> None:
        """Ends the subscription (closes its connection); iteration ends."""
        self._closed = True
        self._disconnect()

    def __next__(self) -> Event:
        deadline = None if self.idle_timeout is None else time.monotonic() + self.idle_timeout
        while not self._closed:
            if self._events:
                event = self._events.popleft()
                if event.get("kind") == "gap" and event.get("reason") == "slow":
                    # What the daemon skipped is read again on a new connection from the last
                    # event yielded (the gap's cursor: everything before the gap was yielded),
                    # and what this one holds after the gap comes again in that replay.
                    self._disconnect()
                    self._resubscribe(self.cursor or _FIRST, deadline)
                    continue
                if isinstance(event.get("cursor"), str):
                    self.cursor = event["cursor"]
                return event
            if self._sock is None:
                if not self._resubscribe(self.cursor or _FIRST, deadline):
                    raise StopIteration
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise StopIteration
            try:
                self._read(left)
            except (ConnectionLost, ProtocolError):
                self._disconnect()
        raise StopIteration

    # --- the connection ---------------------------------------------------------------------

    def _subscribe(self, since: str | None) -> None:
        """Connects and subscribes from ``since``; raises what went wrong."""
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise ConnectFailed(f"cannot make a Unix socket: {e}") from e
        try:
            sock.settimeout(self.connect_timeout)
            sock.connect(self.socket_path)
        except OSError as e:
            sock.close()
            raise ConnectFailed(f"cannot connect to {self.socket_path}: {e.strerror or e}") from e
        self._sock, self._in = sock, bytearray()
        self._events.clear()
        params: dict[str, Any] = {}
        if self.app is not None:
            params["app"] = self.app
        if self.kinds is not None:
            params["kinds"] = self.kinds
        if since is not None:
            params["since"] = since
        request = {"jsonrpc": "2.0", "id": 1, "method": "events.subscribe", "params": params}
        try:
            sock.settimeout(self.timeout)
            sock.sendall(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        except OSError as e:
            self._disconnect()
            raise ConnectionLost(f"events.subscribe was not sent: {e.strerror or e}") from e
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        answer: dict[str, Any] | None = None
        while answer is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._disconnect()
                raise CallTimeout(f"events.subscribe: no answer within {self.timeout} s")
            answer = self._read(left, answer_id=1)
        if "error" in answer:
            self._disconnect()
            raise error_from_response(answer["error"])
        result = answer.get("result")
        started = result.get("cursor") if isinstance(result, dict) else None
        # A daemon with no event yet answers null: every event it will have comes after "0".
        self.cursor = started if isinstance(started, str) else (since or _FIRST)

    def _resubscribe(self, since: str, deadline: float | None) -> bool:
        """Subscribes again: at once, then after a pause twice as long after each failure (up
        to ``max_backoff``); False when ``deadline`` would pass first."""
        pause = 0.05
        while not self._closed:
            try:
                self._subscribe(since)
                self.resubscribed += 1
                return True
            except (ConnectFailed, ConnectionLost, CallTimeout, ProtocolError, Overloaded, StoreUnavailable):
                pass
            if deadline is not None and time.monotonic() + pause > deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, self.max_backoff)
        return False

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        self._events.clear()
        self._in.clear()
        if sock is not None:
            sock.close()

    def _read(self, timeout: float | None, answer_id: int | None = None) -> dict[str, Any] | None:
        """Reads what comes within ``timeout``: events are queued; the answer to ``answer_id``
        is returned when it is among them. ConnectionLost at the end of the connection."""
        sock = self._sock
        if sock is None:
            raise ConnectionLost("the connection is closed")
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            return None
        try:
            data = sock.recv(_READ_CHUNK)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return None
        except OSError as e:
            raise ConnectionLost(f"reading failed: {e.strerror or e}") from e
        if not data:
            raise ConnectionLost("the daemon closed the connection")
        self._in += data
        answer = None
        while (end := self._in.find(b"\n")) >= 0:
            line = bytes(self._in[:end])
            del self._in[: end + 1]
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError as e:
                raise ProtocolError(f"a message that is not JSON ({e}): {line[:200]!r}") from e
            if not isinstance(message, dict):
                raise ProtocolError(f"not a JSON-RPC 2.0 message: {line[:200]!r}")
            if message.get("method") == "events" and "id" not in message:
                params = message.get("params")
                events = params.get("events") if isinstance(params, dict) else None
                if not isinstance(events, list):
                    raise ProtocolError(f"an events notification without events: {line[:200]!r}")
                self._events.extend(e for e in events if isinstance(e, dict))
            elif "id" in message and (message["id"] == answer_id or message["id"] is None):
                answer = message
        return answer
