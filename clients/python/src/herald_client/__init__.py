"""herald_client: Herald's JSON-RPC 2.0 interface on its Unix socket, from Python.

    from herald_client import Client

    with Client("/run/herald/herald.sock") as herald:
        herald.device_register(user="alice", platform="fcm", token=fcm_token)
        sent = herald.push_send(to={"users": ["alice"]}, data={"thread": "t1"})
        status = herald.wait(sent["message_id"])

Standard library only. See README.md beside this package, and docs/interface.md of Herald.
"""

from .client import DEFAULT_SOCKET, UNSET, Client, Pending, Pipeline, Unset
from .events import EventStream
from .errors import (
    CallTimeout,
    Conflict,
    ConnectFailed,
    ConnectionLost,
    Forbidden,
    HeraldError,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    NotPubliclyRoutable,
    Overloaded,
    ParseError,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    RPCError,
    StoreUnavailable,
    UnknownApp,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SOCKET",
    "UNSET",
    "Unset",
    "Client",
    "Pending",
    "Pipeline",
    "EventStream",
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
]
