"""The exceptions of herald_client.

Every exception the client raises is a ``HeraldError``. An error answer of the daemon is an
``RPCError`` carrying the JSON-RPC ``code``, ``message`` and ``data``; each code of
docs/interface.md has its own subclass, so callers branch with ``except``. The others say
what became of a call the daemon did not answer: ``ConnectFailed`` (nothing was sent),
``ConnectionLost`` and ``CallTimeout`` (sent; it may or may not have been carried out, so
retry a ``push.send`` with the same ``idempotency_key``), ``ProtocolError`` (the answer was not
JSON-RPC 2.0).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "HeraldError",
    "ConnectFailed",
    "ConnectionLost",
    "CallTimeout",
    "ProtocolError",
    "RPCError",
    "ParseError",
    "InvalidRequest",
    "MethodNotFound",
    "InvalidParams",
    "InternalError",
    "StoreUnavailable",
    "NotPubliclyRoutable",
    "RateLimited",
    "NotFound",
    "UnknownApp",
    "PayloadTooLarge",
    "Forbidden",
    "Overloaded",
    "Conflict",
    "error_from_response",
]


class HeraldError(Exception):
    """Base of every error raised by herald_client."""


class ConnectFailed(HeraldError, ConnectionError):
    """The socket could not be connected to (no daemon, wrong path, no permission).
    Nothing was sent; the call may be retried as it is."""


class ConnectionLost(HeraldError, ConnectionError):
    """The connection ended before the call was answered. The call was sent and may have
    been carried out."""


class CallTimeout(HeraldError, TimeoutError):
    """No answer within the call's timeout. The call was sent and may have been carried out;
    a late answer is read and dropped, and the connection stays usable."""


class ProtocolError(HeraldError):
    """The daemon's bytes were not a JSON-RPC 2.0 response to a call of this connection.
    The connection is closed (the next call opens a new one)."""


class RPCError(HeraldError):
    """An error answer: ``code``, ``message`` and ``data`` as the daemon sent them.

    ``data`` is the error's data member (usually an object with ``reason``), or None.
    """

    #: The JSON-RPC code this class stands for (None: any code without a class of its own).
    CODE: ClassVar[int | None] = None

    code: int
    message: str
    data: Any

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data

    def __str__(self) -> str:
        text = f"{self.code} {self.message}"
        if self.data is not None:
            text += f" {self.data}"
        return text

    def _data_member(self, key: str) -> Any:
        return self.data.get(key) if isinstance(self.data, dict) else None

    @property
    def reason(self) -> str | None:
        """``data.reason``: the stable name of the error, when the daemon gave one."""
        value = self._data_member("reason")
        return value if isinstance(value, str) else None

    @property
    def retry_after(self) -> float | None:
        """``data.retry_after_ms`` in seconds (``RateLimited``, ``Overloaded``), else None."""
        value = self._data_member("retry_after_ms")
        return value / 1000 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ParseError(RPCError):
    """-32700: the daemon could not parse a message as JSON."""

    CODE = -32700


class InvalidRequest(RPCError):
    """-32600: not a valid request; also a message over 4 MiB (``message too large``, the
    daemon then closes the connection), ``too_many_values`` and ``request_timeout``."""

    CODE = -32600


class MethodNotFound(RPCError):
    """-32601: no such method (``data.method``)."""

    CODE = -32601


class InvalidParams(RPCError):
    """-32602: a parameter is missing, unknown or malformed. Nothing was stored."""

    CODE = -32602

    @property
    def field(self) -> str | None:
        """``data.field``: the parameter at fault, dotted for nested values (``keys.p256dh``)."""
        value = self._data_member("field")
        return value if isinstance(value, str) else None


class InternalError(RPCError):
    """-32603: the daemon could not serve the call."""

    CODE = -32603


class StoreUnavailable(InternalError):
    """-32603 with reason ``store_unavailable``: nothing of the call was kept; it may be tried
    again."""


class NotPubliclyRoutable(RPCError):
    """1001: a Web Push endpoint resolves to a private or reserved address (which one is not said)."""

    CODE = 1001


class RateLimited(RPCError):
    """1002: too many registrations or unregistrations for this (app, user); see
    ``retry_after``."""

    CODE = 1002


class NotFound(RPCError):
    """1003: ``push.status`` / ``push.cancel`` of a message this app does not have."""

    CODE = 1003


class UnknownApp(RPCError):
    """1004: no ``[app.NAME]`` section for the call's ``app``."""

    CODE = 1004


class PayloadTooLarge(RPCError):
    """1005: a ``push.send`` payload over a transport's limit (``data.platform``,
    ``data.limit``, ``data.size``). Nothing was queued."""

    CODE = 1005


class Forbidden(RPCError):
    """1006: this process's uid/gid/groups are not allowed for the app."""

    CODE = 1006


class Overloaded(RPCError):
    """1007: a connection limit, the connection's reply budget or the delivery queue is full;
    see ``retry_after``."""

    CODE = 1007


class Conflict(RPCError):
    """1008: a registration ``version`` older than, or clashing with, the stored one."""

    CODE = 1008

    @property
    def version(self) -> int | None:
        """``data.version``: the stored version."""
        value = self._data_member("version")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


_BY_CODE: dict[int, type[RPCError]] = {
    cls.CODE: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        NotPubliclyRoutable,
        RateLimited,
        NotFound,
        UnknownApp,
        PayloadTooLarge,
        Forbidden,
        Overloaded,
        Conflict,
    )
    if cls.CODE is not None
}


def error_from_response(error: Any) -> RPCError:
    """The exception for a response's ``error`` member (an object with ``code``, ``message``
    and maybe ``data``). ProtocolError when it is not such an object."""
    if not isinstance(error, dict):
        raise ProtocolError(f"error member is not an object: {error!r}")
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        raise ProtocolError(f"error member without an integer code and a string message: {error!r}")
    data = error.get("data")
    cls = _BY_CODE.get(code, RPCError)
    if cls is InternalError and isinstance(data, dict) and data.get("reason") == "store_unavailable":
        cls = StoreUnavailable
    return cls(code, message, data)
