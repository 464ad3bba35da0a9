"""A JSON-RPC 2.0 client for Herald's Unix socket.

Framing (docs/interface.md): each message is one JSON text; the client writes compact JSON and
a newline, the daemon answers with compact JSON and a newline. Answers carry the request's
``id`` and may come in any order, so every call of a connection is matched by id: one call at a
time, or many written before their answers are read (``Client.pipeline``).
"""

from __future__ import annotations

import datetime
import enum
import heapq
import itertools
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Generic, TypeVar, cast

from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    HeraldError,
    ProtocolError,
    RPCError,
    error_from_response,
)
from .events import EventStream
from .types import (
    Accepted,
    ActivityEvent,
    ActivityList,
    ActivityRegistration,
    Alert,
    Cancelled,
    Channel,
    ChannelList,
    DeclarativeNotification,
    DeviceList,
    During,
    Environment,
    EventKind,
    Health,
    InterruptionLevel,
    Kind,
    MessageStatus,
    Metrics,
    OpenRPCDocument,
    Platform,
    Priority,
    QuietHours,
    Registration,
    Removed,
    ShrinkStep,
    Stats,
    Target,
    UpdatedDevice,
    VapidPublicKey,
    WebPushKeys,
)

__all__ = ["Client", "Pipeline", "Pending", "DEFAULT_SOCKET", "UNSET", "Unset"]

T = TypeVar("T")

#: Where a packaged Herald listens (``[server] socket``); ``$HERALD_SOCKET`` wins when set.
DEFAULT_SOCKET = "/run/herald/herald.sock"

#: ``push.send``'s ``timeout_ms`` when ``wait`` is given without one (docs/interface.md).
_SEND_WAIT_DEFAULT_MS = 30000

_READ_CHUNK = 256 * 1024
_WRITE_CHUNK = 1024 * 1024
# A pipeline writes what it has queued (and reads what has come back) once this much waits.
_PIPELINE_WRITE_AT = 64 * 1024


class _Unset(enum.Enum):
    """The default of a ``timeout`` argument: the client's own."""

    TIMEOUT = 0


class Unset(enum.Enum):
    """The type of ``UNSET``."""

    UNSET = 0

    def __repr__(self) -> str:
        return "UNSET"


#: The default of the device rules (``time_zone``, ``quiet_hours``, ``topics``) of
#: ``device_register`` and ``device_update``: left out of the call, so the stored value stays.
#: ``None`` given for one of them is sent as null and clears it.
UNSET: Final = Unset.UNSET

# device.register's and device.update's params whose None is sent (as null): the device rules,
# which null clears.
_DEVICE_RULES = frozenset({"time_zone", "quiet_hours", "topics"})


def _json_default(value: Any) -> Any:
    # Mappings and sequences that are not dicts and lists (MappingProxyType, tuples of tuples...).
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (Sequence, set, frozenset)) and not isinstance(value, (str, bytes, bytearray)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _given(arguments: dict[str, Any], clearable: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A method's keyword arguments (its ``locals()``) as params: the ones given, not UNSET and
    not None (but those in ``clearable``, whose None is sent as null); ``not_before`` as RFC
    3339."""
    params = {
        k: v
        for k, v in arguments.items()
        if k != "self" and v is not UNSET and (v is not None or k in clearable)
    }
    if isinstance(params.get("not_before"), datetime.datetime):
        params["not_before"] = _rfc3339(params["not_before"])
    return params


def _rfc3339(moment: datetime.datetime) -> str:
    """An aware datetime as RFC 3339 UTC with milliseconds (what the daemon keeps)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("not_before must be an aware datetime (with a tzinfo), or an RFC 3339 string")
    utc = moment.astimezone(datetime.timezone.utc)
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Pending(Generic[T]):
    """The answer to a call queued on a ``Pipeline``: ``result()`` returns it or raises the
    call's error (reading from the connection until it is there, if need be)."""

    __slots__ = ("_connection", "id", "method", "_timeout", "_deadline", "_done", "_value", "_error")

    def __init__(self, connection: _Connection, request_id: int, method: str, timeout: float | None) -> None:
        self._connection = connection
        self.id = request_id
        self.method = method
        self._timeout = timeout
        self._deadline: float | None = None
        self._done = False
        self._value: Any = None
        self._error: HeraldError | None = None

    def __repr__(self) -> str:
        state = "done" if self._done else "waiting"
        return f"<Pending {self.method} id={self.id} {state}>"

    def done(self) -> bool:
        """True once the answer (or the call's failure) is known."""
        return self._done

    def result(self) -> T:
        """The call's result; raises its ``RPCError``, or ``CallTimeout`` / ``ConnectionLost``."""
        if not self._done:
            self._connection.wait_for([self])
        if self._error is not None:
            raise self._error
        return cast(T, self._value)

    def exception(self) -> HeraldError | None:
        """The call's error, or None if it succeeded (waits for the answer like ``result``)."""
        if not self._done:
            self._connection.wait_for([self])
        return self._error

    # Called by the connection.
    def _start_clock(self, now: float) -> float:
        if self._deadline is None:
            self._deadline = float("inf") if self._timeout is None else now + self._timeout
        return self._deadline

    def _resolve(self, value: Any) -> None:
        self._done, self._value = True, value

    def _fail(self, error: HeraldError) -> None:
        self._done, self._error = True, error


class _Connection:
    """One Unix stream connection: requests queued as bytes, answers matched by id.

    Not thread-safe by itself; ``Client`` holds a lock around every use."""

    def __init__(self, path: str, connect_timeout: float | None) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise ConnectFailed(f"cannot make a Unix socket: {e}") from e
        try:
            sock.settimeout(connect_timeout)
            sock.connect(path)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            raise ConnectFailed(f"cannot connect to {path}: {e.strerror or e}") from e
        self._sock = sock
        self._poll = select.poll()
        self._out = bytearray()
        self._in = bytearray()
        self._ids = itertools.count(1)
        self._waiting: dict[int, Pending[Any]] = {}
        # Ids whose caller gave up (timeout): their late answers are read and dropped.
        self._abandoned: set[int] = set()
        # An error answer with a null id that could not be given to one call.
        self._orphan: RPCError | None = None

    @property
    def open(self) -> bool:
        return self._sock is not None

    def close(self, why: str = "the client closed the connection") -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        sock.close()
        self._out.clear()
        self._in.clear()
        waiting, self._waiting = self._waiting, {}
        if waiting:
            if self._orphan is not None:
                why += f" (the daemon's last error without an id: {self._orphan})"
            for p in waiting.values():
                lost = ConnectionLost(f"{p.method} (id {p.id}) got no answer: {why}")
                lost.__cause__ = self._orphan
                p._fail(lost)

    def idle(self) -> bool:
        return not self._waiting and not self._out

    def peer_closed(self) -> bool:
        """For an idle connection: whether the daemon has closed it (idle timeout, restart)."""
        assert self._sock is not None
        try:
            data = self._sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        if not data:
            return True
        # Bytes on an idle connection: an answer to nothing of ours (such as an `overloaded`
        # notice before a close). Read them so that a close behind them is seen.
        self._read()
        return self._sock is None

    def queue(self, method: str, params: Mapping[str, Any] | None, timeout: float | None) -> Pending[Any]:
        if self._sock is None:
            raise ConnectionLost("the connection is closed")
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=_json_default)
        self._out += line.encode("utf-8")
        self._out += b"\n"
        pending: Pending[Any] = Pending(self, request_id, method, timeout)
        self._waiting[request_id] = pending
        return pending

    def notify(self, method: str, params: Mapping[str, Any] | None) -> None:
        if self._sock is None:
            raise ConnectionLost("the connection is closed")
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._out += json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=_json_default).encode()
        self._out += b"\n"

    def wait_for(self, targets: list[Pending[Any]]) -> None:
        """Writes what is queued and reads answers until every target is done. A target whose
        deadline passes fails with CallTimeout; a lost connection fails them all."""
        now = time.monotonic()
        heap = [(p._start_clock(now), i, p) for i, p in enumerate(targets) if not p._done]
        heapq.heapify(heap)
        while heap:
            deadline, _, first = heap[0]
            if first._done:
                heapq.heappop(heap)
                continue
            now = time.monotonic()
            if deadline <= now:
                heapq.heappop(heap)
                self._expire(first)
                continue
            if self._sock is None:
                # Closed meanwhile (close() fails every waiting call); anything left was
                # expired or answered already.
                first._fail(ConnectionLost(f"{first.method} (id {first.id}): the connection is closed"))
                continue
            self._pump(deadline - now)

    def drain_output(self, timeout: float | None) -> None:
        """Writes everything queued (for notifications), reading answers meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._sock is not None and self._out:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CallTimeout("the daemon did not take the notification in time")
            self._pump(left)

    def pump_nowait(self) -> None:
        """Writes and reads what can be without blocking (a long pipeline on its way)."""
        if self._sock is not None:
            self._pump(0)

    def _expire(self, pending: Pending[Any]) -> None:
        self._waiting.pop(pending.id, None)
        self._abandoned.add(pending.id)
        timeout = pending._timeout
        pending._fail(CallTimeout(f"{pending.method} (id {pending.id}): no answer within {timeout} s"))

    def _pump(self, timeout: float | None) -> None:
        """One poll: write what the socket takes, read what has come."""
        sock = self._sock
        assert sock is not None
        events = select.POLLIN
        if self._out:
            events |= select.POLLOUT
        self._poll.register(sock, events)
        try:
            ready = self._poll.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
        except InterruptedError:
            return
        finally:
            # The socket may have been closed by now; unregister by descriptor number.
            try:
                self._poll.unregister(sock)
            except (KeyError, ValueError):
                pass
        for _, revents in ready:
            if revents & select.POLLOUT and self._sock is not None:
                self._write()
            if revents & (select.POLLIN | select.POLLHUP | select.POLLERR) and self._sock is not None:
                self._read()

    def _write(self) -> None:
        assert self._sock is not None
        try:
            sent = self._sock.send(memoryview(self._out)[:_WRITE_CHUNK], socket.MSG_NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            # The daemon closed its side; what it said before that is still to be read.
            self._read()
            self.close(f"writing failed: {e.strerror or e}")
            return
        del self._out[:sent]

    def _read(self) -> None:
        while self._sock is not None:
            try:
                data = self._sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.close(f"reading failed: {e.strerror or e}")
                return
            if not data:
                self.close("the daemon closed the connection")
                return
            start = len(self._in)
            self._in += data
            if self._in.find(b"\n", start) < 0:
                continue
            lines = self._in.split(b"\n")
            self._in = bytearray(lines.pop())
            for line in lines:
                if line.strip():
                    self._answer(bytes(line))
                if self._sock is None:
                    return

    def _answer(self, line: bytes) -> None:
        try:
            response = json.loads(line)
        except ValueError as e:
            self._protocol_error(f"an answer that is not JSON ({e}): {line[:200]!r}")
            return
        if not isinstance(response, dict) or response.get("jsonrpc") != "2.0" or "id" not in response:
            self._protocol_error(f"not a JSON-RPC 2.0 response: {line[:200]!r}")
            return
        has_result, has_error = "result" in response, "error" in response
        if has_result == has_error:
            self._protocol_error(f"a response needs exactly one of result and error: {line[:200]!r}")
            return
        request_id = response["id"]
        error: RPCError | None = None
        if has_error:
            try:
                error = error_from_response(response["error"])
            except ProtocolError as e:
                self._protocol_error(str(e))
                return
        if request_id is None:
            # The daemon could not tell which request this answers (a message over 4 MiB, one
            # not complete in time, too many values). With one call waiting, it is that call's.
            if error is None:
                self._protocol_error(f"a result with a null id: {line[:200]!r}")
            elif len(self._waiting) == 1:
                (only,) = self._waiting.values()
                del self._waiting[only.id]
                only._fail(error)
                # The daemon closes the connection after most of these (message too large,
                # request timeout); with nothing else waiting, the next call takes a new one
                # rather than racing that close.
                self.close("the daemon answered a request it could not identify")
            else:
                self._orphan = error
            return
        if isinstance(request_id, bool) or not isinstance(request_id, int):
            self._protocol_error(f"an answer with an id this client never uses: {line[:200]!r}")
            return
        pending = self._waiting.pop(request_id, None)
        if pending is None:
            if request_id in self._abandoned:
                self._abandoned.discard(request_id)
                return
            self._protocol_error(f"an answer to id {request_id}, which is not waiting: {line[:200]!r}")
            return
        if error is not None:
            pending._fail(error)
        else:
            pending._resolve(response["result"])

    def _protocol_error(self, what: str) -> None:
        waiting = list(self._waiting.values())
        self._waiting.clear()
        for p in waiting:
            p._fail(ProtocolError(f"{p.method} (id {p.id}): {what}"))
        self.close(what)


class Client:
    """A connection to Herald's socket, one method per RPC.

    ``socket_path`` defaults to ``$HERALD_SOCKET``, then ``/run/herald/herald.sock``. ``app``
    is sent with every call that does not name one (the daemon's default is ``"default"``).
    ``timeout`` is how long a call waits for its answer, in seconds (None: forever); a
    ``push_send(wait=True)`` waits ``timeout_ms`` longer. The socket is connected at once
    (``ConnectFailed``) and again on the next call after the daemon closed it; a call is never
    sent twice by the client.

    Methods take keyword arguments named as the RPC's params; only the ones given (not None)
    are sent. The device rules of ``device_register`` and ``device_update`` (``time_zone``,
    ``quiet_hours``, ``topics``) default to ``UNSET`` instead, and ``None`` given for one is
    sent as null, which clears it. Results are the daemon's JSON objects; errors raise
    ``RPCError`` subclasses.
    One Client may be shared by threads (calls take turns on the connection)."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        app: str | None = None,
        timeout: float | None = 10.0,
        connect_timeout: float | None = 5.0,
    ) -> None:
        if socket_path is None:
            socket_path = os.environ.get("HERALD_SOCKET") or DEFAULT_SOCKET
        self.socket_path = os.fspath(socket_path)
        self.app = app
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._connection: _Connection | None = _Connection(self.socket_path, connect_timeout)

    def __repr__(self) -> str:
        state = "open" if self._connection is not None and self._connection.open else "closed"
        return f"<herald_client.Client {self.socket_path} {state}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection; calls still waiting on a pipeline fail with ConnectionLost."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _ready(self) -> _Connection:
        """The open connection, made anew if the daemon closed the old one while it was idle."""
        connection = self._connection
        if connection is not None and connection.open and connection.idle() and connection.peer_closed():
            connection = None
        if connection is None or not connection.open:
            connection = _Connection(self.socket_path, self.connect_timeout)
            self._connection = connection
        return connection

    def _params(self, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if self.app is None or params is None or "app" in params:
            return None if params is None else dict(params)
        return {**params, "app": self.app}

    def _call_timeout(self, method: str, params: Mapping[str, Any] | None, timeout: float | None) -> float | None:
        if timeout is None:
            return None
        if method == "push.send" and params is not None and params.get("wait") is True:
            wait_ms = params.get("timeout_ms", _SEND_WAIT_DEFAULT_MS)
            if isinstance(wait_ms, (int, float)):
                timeout += wait_ms / 1000
        return timeout

    def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float | None | _Unset = _Unset.TIMEOUT
    ) -> Any:
        """Any method by its name (``"device.list"``) with params as a mapping; its result.
        ``timeout`` is this call's whole wait; by default the client's (plus ``timeout_ms`` for
        a ``push.send`` with ``wait``)."""
        with self._lock:
            sent = self._params(params)
            if isinstance(timeout, _Unset):
                timeout = self._call_timeout(method, sent, self.timeout)
            return self._ready().queue(method, sent, timeout).result()

    def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """A JSON-RPC notification: the daemon carries it out and never answers, errors
        included."""
        with self._lock:
            connection = self._ready()
            connection.notify(method, self._params(params))
            connection.drain_output(self.timeout)

    def pipeline(self, *, timeout: float | None | _Unset = _Unset.TIMEOUT) -> Pipeline:
        """Calls written back to back and answered by id, in a ``with`` block::

            with client.pipeline() as p:
                calls = [p.device_list(user=u) for u in users]
            lists = [c.result() for c in calls]

        Each call's ``timeout`` (default the client's) runs from when its answer is first
        waited for: at the block's end, or at ``result()`` inside it."""
        return Pipeline(self, self.timeout if isinstance(timeout, _Unset) else timeout)

    def events(
        self,
        *,
        app: str | None = None,
        kinds: Sequence[EventKind] | None = None,
        since: str | None = None,
        idle_timeout: float | None = None,
    ) -> EventStream:
        """The daemon's events (``events.subscribe``) on a connection of their own, as an
        iterator of dicts that resumes by cursor::

            with herald.events(kinds=["delivery", "message_complete"], since=saved) as stream:
                for event in stream:
                    handle(event)
                    saved = stream.cursor

        Subscribes at once: every app the caller may use, or ``app`` (default the client's);
        the ``kinds`` given (default all); after the cursor ``since`` (default from now).
        ``stream.cursor`` is the cursor of the last event yielded. A lost connection is made
        again with backoff and subscribed from that cursor; a ``gap`` with reason ``slow`` is
        read again from the gap's cursor; so nothing is missed (an event may come twice). A
        ``gap`` with reason ``retention`` (events purged unread) is yielded. With
        ``idle_timeout``, iteration ends when no event came for that many seconds."""
        return EventStream(
            self.socket_path,
            app=self.app if app is None else app,
            kinds=kinds,
            since=since,
            idle_timeout=idle_timeout,
            connect_timeout=self.connect_timeout,
            timeout=self.timeout,
        )

    def wait(
        self,
        message_id: str,
        *,
        timeout: float | None = 30.0,
        detail: bool | None = None,
        app: str | None = None,
        interval: float = 0.05,
        max_interval: float = 1.0,
    ) -> MessageStatus:
        """Polls ``push.status`` until the message's ``state`` is ``complete`` (every delivery
        final) or ``timeout`` seconds pass; returns the last status (``state`` tells which).
        The interval starts at ``interval`` and doubles up to ``max_interval``. To wait within
        the send itself, use ``push_send(wait=True, timeout_ms=...)``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.push_status(message_id=message_id, detail=detail, app=app)
            if status["state"] == "complete":
                return status
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return status
            pause = interval if deadline is None else min(interval, deadline - now)
            time.sleep(pause)
            interval = min(interval * 2, max_interval)

    # --- the methods (docs/openrpc.json) ---------------------------------------------------

    def device_register(
        self,
        *,
        user: str,
        platform: Platform,
        token: str,
        keys: WebPushKeys | Mapping[str, str] | None = None,
        environment: Environment | None = None,
        name: str | None = None,
        app_version: str | None = None,
        session: str | None = None,
        registration_id: str | None = None,
        version: int | None = None,
        bundle_id: str | None = None,
        application_server_key: str | None = None,
        app: str | None = None,
        app_id: str | None = None,
        user_agent: str | None = None,
        time_zone: str | None | Unset = UNSET,
        quiet_hours: QuietHours | Mapping[str, Any] | None | Unset = UNSET,
        during: During | None = None,
        topics: Sequence[str] | None | Unset = UNSET,
    ) -> Registration:
        """Registers or refreshes a device of ``user`` (``device.register``).

        ``bundle_id`` (apns and apns_voip only): one of the app's ``apns_topics``; left out, a
        new device gets the app's default and a registered one keeps its own.
        ``application_server_key`` (web only): the VAPID public key the subscription was made
        with (the browser's ``applicationServerKey``), the app's current or previous key;
        left out, the current key. ``keys`` with an https endpoint as ``token`` is the Web Push
        form: always for ``web`` and ``unified_push``, optional for ``fcm`` and ``apns_voip``.
        ``app_id``: the client build (``stable`` when left out), part of the registration's
        identity; ``user_agent``: 1 to 1024 characters, stored and listed.

        The device's own rules, as ``device_update`` takes them: ``time_zone``, ``quiet_hours``
        (with ``during``) and ``topics``; left out (``UNSET``), the stored ones stay, ``None``
        clears one."""
        return cast(Registration, self.call("device.register", _given(locals(), _DEVICE_RULES)))

    def device_unregister(
        self,
        *,
        user: str,
        device_id: str | None = None,
        platform: Platform | None = None,
        token: str | None = None,
        environment: Environment | None = None,
        registration_id: str | None = None,
        version: int | None = None,
        app: str | None = None,
        app_id: str | None = None,
    ) -> Removed:
        """Removes one of the user's devices: by ``device_id``; by ``platform``, ``token`` (and
        ``environment``, ``app_id``: default ``stable``); or by ``registration_id`` and ``version``
        (``device.unregister``)."""
        return cast(Removed, self.call("device.unregister", _given(locals())))

    def device_list(self, *, user: str, app: str | None = None) -> DeviceList:
        """The user's devices, newest registration first (``device.list``)."""
        return cast(DeviceList, self.call("device.list", _given(locals())))

    def device_update(
        self,
        *,
        device_id: str,
        user: str | None = None,
        name: str | None = None,
        enabled: bool | None = None,
        time_zone: str | None | Unset = UNSET,
        quiet_hours: QuietHours | Mapping[str, Any] | None | Unset = UNSET,
        during: During | None = None,
        topics: Sequence[str] | None | Unset = UNSET,
        app: str | None = None,
    ) -> UpdatedDevice:
        """Renames a device, turns it off or on, or sets its own rules, by its ``device_id``
        (``device.update``); give at least one of ``name``, ``enabled``, ``time_zone``,
        ``quiet_hours`` and ``topics``. With ``user`` the device must be that user's;
        without it, the app's device of that id. ``enabled=False`` keeps the
        device (listed with ``enabled: False``) and makes sends skip it (``skipped``, reason
        ``device_disabled``) until ``enabled=True``; ``name=""`` is an empty name. Neither
        changes its registration (``registered_at``, eviction order). An id not found that way
        raises ``NotFound`` (1003, ``data.device_id``). Returns
        ``{"device": ...}`` as ``device_list`` shows it.

        The device's own rules (docs/interface.md, "Each device's own rules"); each left out
        (``UNSET``, the default) keeps what is stored, and ``None`` clears it (sent as null):

        - ``time_zone``: an IANA name (``"Europe/Paris"``) of the daemon's tz database.
        - ``quiet_hours``: ``{"start": "22:00", "end": "07:00", "days": ["fri", "sat"],
          "during": "hold"}`` (``days`` and ``during`` optional; ``during`` may instead be given
          as the ``during`` argument): ``hold`` keeps a push until the period ends, ``silent``
          sends it without sound or banner, ``drop`` skips it (``quiet_hours``). Needs a
          ``time_zone``, given here or stored (``InvalidParams`` otherwise).
        - ``topics``: the message topics the device wants (``[]``: none); a ``push_send`` with
          ``topics`` reaches it only when they share one (else ``skipped``, ``not_subscribed``)."""
        return cast(UpdatedDevice, self.call("device.update", _given(locals(), _DEVICE_RULES)))

    def session_end(self, *, user: str, session: str, app: str | None = None) -> Removed:
        """Deletes the user's devices registered with ``session`` (``session.end``)."""
        return cast(Removed, self.call("session.end", _given(locals())))

    def user_forget(self, *, user: str, app: str | None = None) -> Removed:
        """Deletes everything Herald holds for the user in the app (``user.forget``)."""
        return cast(Removed, self.call("user.forget", _given(locals())))

    def activity_register(
        self,
        *,
        user: str,
        device_id: str,
        push_to_start_token: str | None = None,
        update_token: str | None = None,
        activity_type: str | None = None,
        activity_id: str | None = None,
        app: str | None = None,
    ) -> ActivityRegistration:
        """Registers a Live Activity token of the user's ``apns`` device ``device_id``
        (``activity.register``): ``push_to_start_token`` with ``activity_type`` (what a
        ``push_send(kind="live_activity", event="start", attributes_type=...)`` reaches), or a
        running activity's ``update_token`` with the app's ``activity_id``."""
        return cast(ActivityRegistration, self.call("activity.register", _given(locals())))

    def activity_unregister(
        self,
        *,
        user: str,
        activity_id: str | None = None,
        device_id: str | None = None,
        activity_type: str | None = None,
        app: str | None = None,
    ) -> Removed:
        """Removes an activity's update tokens (``activity_id``) or a device's push-to-start
        token (``device_id`` and ``activity_type``) (``activity.unregister``)."""
        return cast(Removed, self.call("activity.unregister", _given(locals())))

    def activity_list(self, *, user: str, app: str | None = None) -> ActivityList:
        """The user's Live Activity tokens, newest first (``activity.list``)."""
        return cast(ActivityList, self.call("activity.list", _given(locals())))

    def channel_create(
        self, *, storage: str, bundle_id: str | None = None, environment: Environment | None = None,
        app: str | None = None,
    ) -> Channel:
        """Creates an APNs broadcast channel (``channel.create``): ``storage`` ``"none"`` or
        ``"latest"``."""
        return cast(Channel, self.call("channel.create", _given(locals())))

    def channel_list(self, *, app: str | None = None) -> ChannelList:
        """The app's broadcast channels, newest first (``channel.list``)."""
        return cast(ChannelList, self.call("channel.list", _given(locals())))

    def channel_delete(self, *, channel_id: str, app: str | None = None) -> Removed:
        """Deletes a broadcast channel at APNs and in Herald (``channel.delete``)."""
        return cast(Removed, self.call("channel.delete", _given(locals())))

    def push_broadcast(
        self,
        *,
        channel_id: str,
        event: ActivityEvent,
        content_state: Mapping[str, Any] | None = None,
        alert: Alert | Mapping[str, Any] | None = None,
        timestamp: int | str | None = None,
        stale_date: int | str | None = None,
        dismissal_date: int | str | None = None,
        relevance_score: float | None = None,
        priority: Priority | None = None,
        ttl: int | None = None,
        idempotency_key: str | None = None,
        wait: bool | None = None,
        timeout_ms: int | None = None,
        app: str | None = None,
    ) -> Accepted:
        """Updates or ends every Live Activity subscribed to the channel with one request to
        APNs (``push.broadcast``); durable like ``push_send``."""
        return cast(Accepted, self.call("push.broadcast", _given(locals())))

    def push_send(
        self,
        *,
        to: Target | Mapping[str, Sequence[str]],
        kind: Kind | None = None,
        data: Mapping[str, str] | None = None,
        alert: Alert | Mapping[str, Any] | None = None,
        badge: int | Mapping[str, int] | None = None,
        collapse_key: str | None = None,
        priority: Priority | None = None,
        ttl: int | None = None,
        idempotency_key: str | None = None,
        wait: bool | None = None,
        timeout_ms: int | None = None,
        interruption_level: InterruptionLevel | None = None,
        relevance_score: float | None = None,
        thread_id: str | None = None,
        category: str | None = None,
        android_channel_id: str | None = None,
        web_payload: Mapping[str, Any] | None = None,
        notification: DeclarativeNotification | Mapping[str, Any] | None = None,
        shrink: Sequence[ShrinkStep | Mapping[str, Any]] | None = None,
        topics: Sequence[str] | None = None,
        not_before: datetime.datetime | str | None = None,
        at_local: str | None = None,
        event: ActivityEvent | None = None,
        activity_id: str | None = None,
        attributes_type: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        content_state: Mapping[str, Any] | None = None,
        timestamp: int | str | None = None,
        stale_date: int | str | None = None,
        dismissal_date: int | str | None = None,
        channel_id: str | None = None,
        app: str | None = None,
    ) -> Accepted:
        """Sends a content-free notification to ``to={"users": [...]}`` or
        ``to={"devices": [...]}`` (``push.send``). The answer means the message is committed;
        with ``wait=True`` it comes when every delivery is final or after ``timeout_ms``.

        For ``kind="notification"`` only: ``interruption_level`` (APNs), ``relevance_score``
        (APNs, 0 to 1), ``thread_id`` (APNs notification grouping), ``category`` (APNs
        actions) and ``android_channel_id`` (FCM; default the app's channel).

        ``web_payload`` (a JSON object, at most 16384 bytes) is the content of Web Push-form
        records, sealed to each device; ``shrink`` lists the steps that bring it under the
        record's 2713 bytes, in order: ``{"drop": [pointers]}``, ``{"shorten": pointer}``,
        ``{"keep": [pointers]}``. APNs and FCM legacy-form devices never receive it. A
        ``web_payload`` with ``"web_push": 8030`` is Declarative Web Push, checked as WebKit reads
        it; ``notification`` (``{"title", "navigate", "body"?, "app_badge"?, …}``) builds one.

        ``kind`` ``widgets``, ``location`` and ``pushtotalk`` go to ``apns_widgets``,
        ``apns_location`` and ``apns_pushtotalk`` registrations only.

        ``kind="live_activity"``: ``event`` ``"start"`` (to the push-to-start tokens of
        ``attributes_type``; needs ``attributes``, ``content_state`` and an ``alert``),
        ``"update"`` or ``"end"`` (to the update tokens of ``activity_id``); ``timestamp``,
        ``stale_date``, ``dismissal_date`` are Unix seconds or RFC 3339 strings. Priority is
        ``normal`` (APNs 5) unless ``"high"`` within the app's ``live_activity_high_per_hour``.

        ``topics`` (up to 16): what the message is about; a device with topics gets it only when
        they share one (the others are ``skipped``, reason ``not_subscribed``). ``not_before``:
        every delivery is held (state ``held``) until then, an aware ``datetime`` (sent as RFC
        3339 UTC) or an RFC 3339 string with ``Z`` or an offset, at most 28 days ahead;
        ``at_local``: ``"HH:MM"``, each delivery held until the device's own clock next reads it
        (a device without a ``time_zone`` is sent at once). Not both; neither for ``call_ring``.
        The TTL counts from acceptance, so give a timed send one that covers its wait."""
        return cast(Accepted, self.call("push.send", _given(locals())))

    def push_status(self, *, message_id: str, detail: bool | None = None, app: str | None = None) -> MessageStatus:
        """What happened to each push of a message (``push.status``)."""
        return cast(MessageStatus, self.call("push.status", _given(locals())))

    def push_cancel(self, *, message_id: str, app: str | None = None) -> Cancelled:
        """Drops the message's deliveries not yet sent (``push.cancel``)."""
        return cast(Cancelled, self.call("push.cancel", _given(locals())))

    def system_health(self, *, app: str | None = None) -> Health:
        """Store and transport health (``system.health``)."""
        return cast(Health, self.call("system.health", _given(locals())))

    def system_stats(self, *, app: str | None = None) -> Stats:
        """Daemon counters (``system.stats``), with ``web_subscriptions_by_key``."""
        return cast(Stats, self.call("system.stats", _given(locals())))

    def system_metrics(self, *, app: str | None = None) -> Metrics:
        """The Prometheus text exposition (``system.metrics``)."""
        return cast(Metrics, self.call("system.metrics", _given(locals())))

    def vapid_public_key(self, *, app: str | None = None) -> VapidPublicKey:
        """The app's VAPID public key (``vapid.public_key``)."""
        return cast(VapidPublicKey, self.call("vapid.public_key", _given(locals())))

    def rpc_discover(self, *, app: str | None = None) -> OpenRPCDocument:
        """The OpenRPC document (``rpc.discover``)."""
        return cast(OpenRPCDocument, self.call("rpc.discover", _given(locals())))


class Pipeline:
    """Calls queued on the client's connection and written back to back, each answered by id
    through its ``Pending``. The methods are the client's; each returns a ``Pending`` at once.
    Leaving the ``with`` block (or ``flush()``) writes every call and reads every answer; a
    call's error stays in its ``Pending`` (``result()`` raises it).

    Writing and reading interleave, so a pipeline of any length cannot stall on the daemon's
    per-connection limits. The client's lock is held from the first call to the flush."""

    def __init__(self, client: Client, timeout: float | None) -> None:
        self._client = client
        self._timeout = timeout
        self._queued: list[Pending[Any]] = []
        self._locked = False

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.flush()
            elif any(not p.done() for p in self._queued):
                # The block raised: its calls are not sent later with someone else's. Those
                # already written may have been carried out (ConnectionLost says so).
                for connection in {id(p._connection): p._connection for p in self._queued}.values():
                    connection.close("the pipeline's block raised before its calls were answered")
                self._queued = []
        finally:
            self._release()

    def __iter__(self) -> Iterator[Pending[Any]]:
        return iter(self._queued)

    def __len__(self) -> int:
        return len(self._queued)

    def _release(self) -> None:
        if self._locked:
            self._locked = False
            self._client._lock.release()

    def flush(self) -> list[Pending[Any]]:
        """Writes every queued call and waits for every answer (or its timeout); the calls
        queued so far, in order."""
        queued, self._queued = self._queued, []
        try:
            # One connection unless the daemon closed it mid-way (its calls have failed then).
            by_connection: dict[int, tuple[_Connection, list[Pending[Any]]]] = {}
            for p in queued:
                by_connection.setdefault(id(p._connection), (p._connection, []))[1].append(p)
            for connection, calls in by_connection.values():
                connection.wait_for(calls)
        finally:
            self._release()
        return queued

    def call(self, method: str, params: Mapping[str, Any] | None = None) -> Pending[Any]:
        """Any method by its name, like ``Client.call``."""
        client = self._client
        if not self._locked:
            client._lock.acquire()
            self._locked = True
        connection = client._ready()
        sent = client._params(params)
        pending = connection.queue(method, sent, client._call_timeout(method, sent, self._timeout))
        self._queued.append(pending)
        if len(connection._out) >= _PIPELINE_WRITE_AT:
            connection.pump_nowait()
        return pending

    # --- the methods, as Client's ----------------------------------------------------------

    def device_register(
        self,
        *,
        user: str,
        platform: Platform,
        token: str,
        keys: WebPushKeys | Mapping[str, str] | None = None,
        environment: Environment | None = None,
        name: str | None = None,
        app_version: str | None = None,
        session: str | None = None,
        registration_id: str | None = None,
        version: int | None = None,
        bundle_id: str | None = None,
        application_server_key: str | None = None,
        app: str | None = None,
        app_id: str | None = None,
        user_agent: str | None = None,
        time_zone: str | None | Unset = UNSET,
        quiet_hours: QuietHours | Mapping[str, Any] | None | Unset = UNSET,
        during: During | None = None,
        topics: Sequence[str] | None | Unset = UNSET,
    ) -> Pending[Registration]:
        return self.call("device.register", _given(locals(), _DEVICE_RULES))

    def device_unregister(
        self,
        *,
        user: str,
        device_id: str | None = None,
        platform: Platform | None = None,
        token: str | None = None,
        environment: Environment | None = None,
        registration_id: str | None = None,
        version: int | None = None,
        app: str | None = None,
        app_id: str | None = None,
    ) -> Pending[Removed]:
        return self.call("device.unregister", _given(locals()))

    def device_list(self, *, user: str, app: str | None = None) -> Pending[DeviceList]:
        return self.call("device.list", _given(locals()))

    def device_update(
        self,
        *,
        device_id: str,
        user: str | None = None,
        name: str | None = None,
        enabled: bool | None = None,
        time_zone: str | None | Unset = UNSET,
        quiet_hours: QuietHours | Mapping[str, Any] | None | Unset = UNSET,
        during: During | None = None,
        topics: Sequence[str] | None | Unset = UNSET,
        app: str | None = None,
    ) -> Pending[UpdatedDevice]:
        return self.call("device.update", _given(locals(), _DEVICE_RULES))

    def session_end(self, *, user: str, session: str, app: str | None = None) -> Pending[Removed]:
        return self.call("session.end", _given(locals()))

    def activity_register(
        self,
        *,
        user: str,
        device_id: str,
        push_to_start_token: str | None = None,
        update_token: str | None = None,
        activity_type: str | None = None,
        activity_id: str | None = None,
        app: str | None = None,
    ) -> Pending[ActivityRegistration]:
        return self.call("activity.register", _given(locals()))

    def activity_unregister(
        self,
        *,
        user: str,
        activity_id: str | None = None,
        device_id: str | None = None,
        activity_type: str | None = None,
        app: str | None = None,
    ) -> Pending[Removed]:
        return self.call("activity.unregister", _given(locals()))

    def activity_list(self, *, user: str, app: str | None = None) -> Pending[ActivityList]:
        return self.call("activity.list", _given(locals()))

    def channel_create(
        self, *, storage: str, bundle_id: str | None = None, environment: Environment | None = None,
        app: str | None = None,
    ) -> Pending[Channel]:
        return self.call("channel.create", _given(locals()))

    def channel_list(self, *, app: str | None = None) -> Pending[ChannelList]:
        return self.call("channel.list", _given(locals()))

    def channel_delete(self, *, channel_id: str, app: str | None = None) -> Pending[Removed]:
        return self.call("channel.delete", _given(locals()))

    def push_broadcast(
        self,
        *,
        channel_id: str,
        event: ActivityEvent,
        content_state: Mapping[str, Any] | None = None,
        alert: Alert | Mapping[str, Any] | None = None,
        timestamp: int | str | None = None,
        stale_date: int | str | None = None,
        dismissal_date: int | str | None = None,
        relevance_score: float | None = None,
        priority: Priority | None = None,
        ttl: int | None = None,
        idempotency_key: str | None = None,
        wait: bool | None = None,
        timeout_ms: int | None = None,
        app: str | None = None,
    ) -> Pending[Accepted]:
        return self.call("push.broadcast", _given(locals()))

    def user_forget(self, *, user: str, app: str | None = None) -> Pending[Removed]:
        return self.call("user.forget", _given(locals()))

    def push_send(
        self,
        *,
        to: Target | Mapping[str, Sequence[str]],
        kind: Kind | None = None,
        data: Mapping[str, str] | None = None,
        alert: Alert | Mapping[str, Any] | None = None,
        badge: int | Mapping[str, int] | None = None,
        collapse_key: str | None = None,
        priority: Priority | None = None,
        ttl: int | None = None,
        idempotency_key: str | None = None,
        wait: bool | None = None,
        timeout_ms: int | None = None,
        interruption_level: InterruptionLevel | None = None,
        relevance_score: float | None = None,
        thread_id: str | None = None,
        category: str | None = None,
        android_channel_id: str | None = None,
        web_payload: Mapping[str, Any] | None = None,
        notification: DeclarativeNotification | Mapping[str, Any] | None = None,
        shrink: Sequence[ShrinkStep | Mapping[str, Any]] | None = None,
        topics: Sequence[str] | None = None,
        not_before: datetime.datetime | str | None = None,
        at_local: str | None = None,
        event: ActivityEvent | None = None,
        activity_id: str | None = None,
        attributes_type: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        content_state: Mapping[str, Any] | None = None,
        timestamp: int | str | None = None,
        stale_date: int | str | None = None,
        dismissal_date: int | str | None = None,
        channel_id: str | None = None,
        app: str | None = None,
    ) -> Pending[Accepted]:
        return self.call("push.send", _given(locals()))

    def push_status(
        self, *, message_id: str, detail: bool | None = None, app: str | None = None
    ) -> Pending[MessageStatus]:
        return self.call("push.status", _given(locals()))

    def push_cancel(self, *, message_id: str, app: str | None = None) -> Pending[Cancelled]:
        return self.call("push.cancel", _given(locals()))

    def system_health(self, *, app: str | None = None) -> Pending[Health]:
        return self.call("system.health", _given(locals()))

    def system_stats(self, *, app: str | None = None) -> Pending[Stats]:
        return self.call("system.stats", _given(locals()))

    def system_metrics(self, *, app: str | None = None) -> Pending[Metrics]:
        return self.call("system.metrics", _given(locals()))

    def vapid_public_key(self, *, app: str | None = None) -> Pending[VapidPublicKey]:
        return self.call("vapid.public_key", _given(locals()))

    def rpc_discover(self, *, app: str | None = None) -> Pending[OpenRPCDocument]:
        return self.call("rpc.discover", _given(locals()))
