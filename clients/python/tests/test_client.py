"""herald_client against a real daemon and the provider test gateways (conftest.py).

What an app server relies on: every method of docs/openrpc.json is there with its params; only
the arguments given are sent; errors arrive as the exception of their code with code, message
and data; pipelined calls are matched by id however many there are; ``wait`` and
``push_send(wait=True)`` end when the deliveries are final; timeouts leave the connection usable;
a daemon restart costs an idle client nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import herald_client
from herald_client import (
    CallTimeout,
    Client,
    Conflict,
    ConnectFailed,
    HeraldError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    PayloadTooLarge,
    Pending,
    RateLimited,
    RPCError,
    StoreUnavailable,
    UnknownApp,
)
from herald_fixtures import Daemon, hex_token

REPO = Path(__file__).resolve().parents[3]
OPENRPC = json.loads((REPO / "docs" / "openrpc.json").read_text())
# Client methods that are not RPCs.
HELPERS = {"call", "notify", "pipeline", "wait", "close", "flush", "events"}
# RPCs that turn a connection into a stream: Client.events (test_events.py) makes them on a
# connection of its own, never one method per call.
STREAMED = {"events.subscribe", "events.unsubscribe"}


def token_hash(token: str) -> str:
    return hashlib.sha256(("push:" + token).encode()).hexdigest()


def rpc_params(method: dict) -> dict[str, bool]:
    """{param name: required} of an OpenRPC method, $refs resolved."""
    out = {}
    for p in method.get("params", []):
        if "$ref" in p:
            p = OPENRPC["components"]["contentDescriptors"][p["$ref"].rsplit("/", 1)[1]]
        out[p["name"]] = bool(p.get("required", False))
    return out


def keyword_params(fn) -> dict[str, bool]:
    """{keyword-only parameter: required} of a method; any other kind of parameter fails."""
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name == "self":
            continue
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, f"{fn.__qualname__}: {name} is not keyword-only"
        out[name] = p.default is inspect.Parameter.empty
    return out


# ----------------------------------------------------------------------------- the method table

@pytest.mark.parametrize("cls", [herald_client.Client, herald_client.Pipeline])
def test_every_method_of_openrpc_json_with_its_params(cls):
    documented = {m["name"]: m for m in OPENRPC["methods"] if m["name"] not in STREAMED}
    assert len(documented) >= 13
    for name, method in documented.items():
        attr = name.replace(".", "_")
        fn = getattr(cls, attr, None)
        assert fn is not None, f"{cls.__name__} has no {attr}() for {name}"
        assert keyword_params(fn) == rpc_params(method), f"{cls.__name__}.{attr}() and {name}'s params differ"
    public = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    extra = public - {n.replace(".", "_") for n in documented} - HELPERS
    assert not extra, f"{cls.__name__} has methods docs/openrpc.json does not know: {sorted(extra)}"


def test_the_daemon_serves_the_methods_the_client_has(daemon):
    with Client(daemon.socket) as herald:
        served = {m["name"] for m in herald.rpc_discover()["methods"]}
    assert served == {m["name"] for m in OPENRPC["methods"]}
    for name in served - STREAMED:
        assert callable(getattr(Client, name.replace(".", "_")))


# ----------------------------------------------------------------------------- calls

class RecordingRelay:
    """A Unix socket in front of the daemon's that passes bytes both ways unchanged and keeps
    what the client wrote: the requests as they went on the wire."""

    def __init__(self, target: str, path: str) -> None:
        self.target, self.path = target, path
        self.sent: list[bytearray] = []  # per connection, in the order they were accepted
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def requests(self) -> list[dict]:
        return [json.loads(line) for sent in self.sent for line in bytes(sent).splitlines() if line.strip()]

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            daemon.connect(self.target)
            self.sent.append(bytearray())
            threading.Thread(target=self._pipe, args=(client, daemon, self.sent[-1]), daemon=True).start()
            threading.Thread(target=self._pipe, args=(daemon, client, None), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def test_only_the_arguments_given_are_sent(daemon, tmp_path):
    relay = RecordingRelay(daemon.socket, str(tmp_path / "relay.sock"))
    try:
        with Client(relay.path) as herald:
            herald.device_register(user="c-wire", platform="fcm", token="c-wire-1", name=None, version=None)
            herald.push_send(to={"users": ["c-wire"]}, ttl=0, data={})
            herald.system_health()
            herald.notify("device.list", {"user": "c-wire"})
        with Client(relay.path, app="default") as herald:
            herald.device_list(user="c-wire")
            herald.device_list(user="c-wire", app="other")
    finally:
        relay.close()
    sent = relay.requests()
    assert [r.get("params") for r in sent] == [
        {"user": "c-wire", "platform": "fcm", "token": "c-wire-1"},
        {"to": {"users": ["c-wire"]}, "ttl": 0, "data": {}},
        {},
        {"user": "c-wire"},
        {"user": "c-wire", "app": "default"},
        {"user": "c-wire", "app": "other"},
    ]
    assert all(r["jsonrpc"] == "2.0" for r in sent)
    ids = [r["id"] for r in sent if "id" in r]
    assert len(ids) == 5 and "id" not in sent[3], sent  # the notification has no id


def test_register_list_unregister(daemon):
    with Client(daemon.socket) as herald:
        first = herald.device_register(user="c-alice", platform="fcm", token="c-alice-1", name="Pixel")
        assert first["created"] is True and first["reclaimed"] is False and first["evicted"] == []
        assert first["token_hash"] == token_hash("c-alice-1")
        # name left out: the stored one stays.
        again = herald.device_register(user="c-alice", platform="fcm", token="c-alice-1", app_version="2.1")
        assert again["device_id"] == first["device_id"] and again["created"] is False
        (device,) = herald.device_list(user="c-alice")["devices"]
        assert device["device_id"] == first["device_id"]
        assert device["name"] == "Pixel" and device["app_version"] == "2.1" and device["platform"] == "fcm"
        assert herald.device_unregister(user="c-alice", device_id=first["device_id"]) == {"removed": 1}
        assert herald.device_list(user="c-alice") == {"devices": []}


def test_sessions_users_and_the_system_methods(daemon):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-sess", platform="fcm", token="c-sess-1", session="s-1")
        herald.device_register(user="c-sess", platform="fcm", token="c-sess-2", session="s-2")
        assert herald.session_end(user="c-sess", session="s-1") == {"removed": 1}
        assert herald.user_forget(user="c-sess") == {"removed": 1}
        assert herald.device_list(user="c-sess")["devices"] == []

        health = herald.system_health()
        assert health["status"] == "ok" and health["store"] == "ok"
        assert health["transports"]["default"]["fcm"] == "ready"
        stats = herald.system_stats()
        assert stats["requests"]["total"] >= 5 and stats["connections"]["open"] >= 1
        metrics = herald.system_metrics()
        assert metrics["content_type"].startswith("text/plain") and "# TYPE" in metrics["text"]
        key = herald.vapid_public_key()["public_key"]
        assert len(key) == 87 and key.startswith("B")


def test_the_clients_app_and_a_calls_own(daemon):
    with Client(daemon.socket, app="other") as herald:
        herald.device_register(user="c-app", platform="fcm", token="c-app-other")
        # the app of the client: the device is in "other", not in "default".
        assert [d["token_hash"] for d in herald.device_list(user="c-app")["devices"]] == [token_hash("c-app-other")]
        assert herald.device_list(user="c-app", app="default")["devices"] == []
        assert herald.system_health()["transports"]["other"]["fcm"].startswith("disabled")
    with Client(daemon.socket, app="no-such-app") as herald:
        with pytest.raises(UnknownApp) as caught:
            herald.system_health()
        assert caught.value.code == 1004 and caught.value.reason == "unknown_app"
        assert herald.system_health(app="default")["status"] == "ok"


def test_socket_path_from_the_environment(daemon, monkeypatch):
    monkeypatch.setenv("HERALD_SOCKET", daemon.socket)
    with Client() as herald:
        assert herald.socket_path == daemon.socket
        assert herald.system_health()["status"] == "ok"


# ----------------------------------------------------------------------------- errors

def test_errors_carry_code_message_and_data_and_the_connection_stays_usable(daemon):
    with Client(daemon.socket) as herald:
        with pytest.raises(InvalidParams) as bad:
            herald.device_register(user="c-err", platform="apns", token="not-hex")
        assert bad.value.code == -32602 and bad.value.message
        assert bad.value.field == "token" and bad.value.data["field"] == "token" and bad.value.reason
        assert isinstance(bad.value, RPCError) and isinstance(bad.value, HeraldError)

        with pytest.raises(InvalidParams) as unknown:
            herald.call("device.list", {"user": "c-err", "colour": "red"})
        assert unknown.value.field == "colour"

        with pytest.raises(MethodNotFound) as missing:
            herald.call("device.paint", {})
        assert missing.value.code == -32601

        with pytest.raises(NotFound) as gone:
            herald.push_status(message_id="0" * 32)
        assert gone.value.code == 1003 and gone.value.reason == "not_found"

        herald.device_register(user="c-err", platform="fcm", token="c-err-1")
        with pytest.raises(PayloadTooLarge) as large:
            herald.push_send(to={"users": ["c-err"]}, data={f"k{i:02}": "x" * 1000 for i in range(60)})
        assert large.value.code == 1005 and large.value.data["platform"] in ("apns", "fcm", "web")
        assert large.value.data["size"] > large.value.data["limit"]

        # Still the same connection, still usable.
        assert herald.device_list(user="c-err")["devices"][0]["token_hash"] == token_hash("c-err-1")


def test_conflict_carries_the_stored_version(daemon):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-ver", platform="fcm", token="c-ver-new", registration_id="inst-1", version=5)
        with pytest.raises(Conflict) as old:
            herald.device_register(user="c-ver", platform="fcm", token="c-ver-old", registration_id="inst-1",
                                   version=3)
        assert old.value.code == 1008 and old.value.version == 5


def test_rate_limit_in_a_pipeline_stays_with_its_call(daemon):
    with Client(daemon.socket) as herald:
        with herald.pipeline() as p:
            calls = [p.device_register(user="c-rate", platform="fcm", token=f"c-rate-{i}") for i in range(21)]
        failed = [c for c in calls if c.exception() is not None]
        assert len(failed) == 1, [c.exception() for c in calls]
        error = failed[0].exception()
        assert isinstance(error, RateLimited) and error.code == 1002
        assert error.retry_after is not None and 0 < error.retry_after <= 60
        with pytest.raises(RateLimited):
            failed[0].result()
        assert sum(1 for c in calls if c.exception() is None) == 20


def test_a_message_over_4_mib_is_invalid_request_and_the_next_call_reconnects(daemon):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-big", platform="fcm", token="c-big-1")
        with pytest.raises(InvalidRequest) as big:
            herald.push_send(to={"users": ["c-big"]}, data={"k": "x" * (5 * 1024 * 1024)})
        assert big.value.code == -32600
        # The daemon closed that connection; the client opens a new one.
        assert herald.device_list(user="c-big")["devices"][0]["token_hash"] == token_hash("c-big-1")


def test_store_unavailable_while_another_process_holds_the_database():
    d = Daemon(transports=("fcm",))
    try:
        with Client(d.socket, timeout=30) as herald:
            herald.device_register(user="c-store", platform="fcm", token="c-store-1")
            # The lock waits (5 s) for a transaction of the daemon's own that
            # is under way (its scheduler claims due work every second).
            lock = sqlite3.connect(os.path.join(d.dir, "herald.db"), timeout=5, isolation_level=None)
            try:
                lock.execute("BEGIN EXCLUSIVE")
                with pytest.raises(StoreUnavailable) as down:
                    herald.device_register(user="c-store", platform="fcm", token="c-store-2")
                assert down.value.code == -32603 and down.value.reason == "store_unavailable"
                assert isinstance(down.value, herald_client.InternalError)
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            assert [x["token_hash"] for x in herald.device_list(user="c-store")["devices"]] == [
                token_hash("c-store-1")]
        d.shutdown()
    finally:
        d.cleanup()


def test_connect_failed_names_the_path(tmp_path):
    path = str(tmp_path / "nobody-listens.sock")
    with pytest.raises(ConnectFailed) as failed:
        Client(path)
    assert path in str(failed.value) and isinstance(failed.value, ConnectionError)


# ----------------------------------------------------------------------------- pipelining

def test_a_pipeline_matches_every_answer_to_its_call(daemon):
    users = [f"c-pipe-{i}" for i in range(150)]
    with Client(daemon.socket) as herald:
        with herald.pipeline() as p:
            registered = [p.device_register(user=u, platform="fcm", token=f"{u}-token") for u in users]
            bad = p.device_register(user="c-pipe-bad", platform="apns", token="zz")
        assert all(isinstance(r, Pending) and r.done() for r in registered + [bad])
        with pytest.raises(InvalidParams):
            bad.result()
        ids = [r.result()["device_id"] for r in registered]
        assert len(set(ids)) == len(users)
        assert all(r.result()["token_hash"] == token_hash(f"{u}-token") for r, u in zip(registered, users))

        # Reads answered in whatever order the daemon finishes them: each list is its user's.
        with herald.pipeline() as p:
            lists = {u: p.device_list(user=u) for u in users}
        for (u, listed), device_id in zip(lists.items(), ids):
            (device,) = listed.result()["devices"]
            assert device["device_id"] == device_id and device["token_hash"] == token_hash(f"{u}-token")


def test_a_long_pipeline_past_the_daemons_per_connection_window(daemon):
    """4,000 calls written without waiting: more than the daemon takes in flight on one
    connection (it stops reading until answers drain), so writing must interleave with reading."""
    with Client(daemon.socket, timeout=120) as herald:
        herald.device_register(user="c-long", platform="fcm", token="c-long-1")
        with herald.pipeline() as p:
            calls = [p.device_list(user="c-long") for _ in range(4000)]
        assert len({c.id for c in calls}) == 4000
        assert all(c.result()["devices"][0]["token_hash"] == token_hash("c-long-1") for c in calls)


def test_result_inside_the_block_reads_up_to_that_answer(daemon):
    with Client(daemon.socket) as herald:
        with herald.pipeline() as p:
            first = p.system_health()
            assert first.result()["status"] == "ok"
            second = p.call("device.list", {"user": "c-inside"})
        assert second.result() == {"devices": []}


def test_threads_share_one_client(daemon):
    errors: list[BaseException] = []
    with Client(daemon.socket) as herald:
        def work(n: int) -> None:
            try:
                user = f"c-thread-{n}"
                herald.device_register(user=user, platform="fcm", token=f"{user}-t")
                for _ in range(30):
                    (device,) = herald.device_list(user=user)["devices"]
                    assert device["token_hash"] == token_hash(f"{user}-t")
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors


def test_a_notification_is_carried_out_and_never_answered(daemon):
    with Client(daemon.socket) as herald:
        herald.notify("device.register", {"user": "c-notify", "platform": "fcm", "token": "c-notify-1"})
        # Any answer to it would arrive before this one's and break the id matching.
        deadline = time.monotonic() + 10
        while not herald.device_list(user="c-notify")["devices"]:
            assert time.monotonic() < deadline, "the notification was not carried out"
            time.sleep(0.05)


# ----------------------------------------------------------------------------- waiting

def test_wait_until_every_delivery_is_final(daemon, gw):
    with Client(daemon.socket) as herald:
        for i in range(3):
            herald.device_register(user="c-wait", platform="fcm", token=f"c-wait-fcm-{i}")
        herald.device_register(user="c-wait", platform="apns", token=hex_token(1, prefix=0xC1))
        sub = gw.subscription()
        herald.device_register(user="c-wait", platform="web", token=sub["endpoint"], keys=gw.web_keys(sub))
        sent = herald.push_send(to={"users": ["c-wait"]}, data={"thread": "t1"}, collapse_key="t1")
        assert sent["devices"] == 5 and "state" not in sent
        status = herald.wait(sent["message_id"], timeout=30, detail=True)
        assert status["state"] == "complete", status
        assert status["counts"]["delivered"] == 5, status["counts"]
        assert {d["platform"] for d in status["devices"]} == {"fcm", "apns", "web"}
        fcm = [r for r in gw.received("fcm", kind="send") if str(r.get("token")).startswith("c-wait-fcm-")]
        assert len(fcm) == 3 and len(gw.received("webpush", token=sub["id"])) == 1


def test_push_send_with_wait_answers_when_final(daemon, gw):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-sendwait", platform="fcm", token="c-sendwait-1")
        gw.program("fcm", [{"status": 200, "delay_ms": 300}])
        done = herald.push_send(to={"users": ["c-sendwait"]}, wait=True, timeout_ms=20000)
        assert done["state"] == "complete" and done["counts"]["delivered"] == 1, done


def test_wait_returns_pending_when_its_timeout_passes(daemon, gw):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-slow", platform="fcm", token="c-slow-1")
        gw.program("fcm", [{"status": 200, "delay_ms": 2000}])
        sent = herald.push_send(to={"users": ["c-slow"]})
        status = herald.wait(sent["message_id"], timeout=0.3)
        assert status["state"] == "pending", status
        assert herald.wait(sent["message_id"], timeout=30)["counts"]["delivered"] == 1


def test_a_call_timeout_drops_the_late_answer_and_keeps_the_connection(daemon, gw):
    with Client(daemon.socket) as herald:
        herald.device_register(user="c-late", platform="fcm", token="c-late-1")
        gw.program("fcm", [{"status": 200, "delay_ms": 1500}])
        t0 = time.monotonic()
        with pytest.raises(CallTimeout) as late:
            # An explicit timeout is the whole wait (push_send adds timeout_ms to the client's).
            herald.call("push.send", {"to": {"users": ["c-late"]}, "wait": True, "timeout_ms": 10000}, timeout=0.3)
        # Not before its timeout; and not the answer, which takes the gateway's 1.5 s.
        assert time.monotonic() - t0 >= 0.3 and isinstance(late.value, TimeoutError)
        time.sleep(2.0)  # the send's answer has come meanwhile: the next call reads and drops it
        assert herald.device_list(user="c-late")["devices"][0]["token_hash"] == token_hash("c-late-1")
        assert herald.system_health()["status"] == "ok"


# ----------------------------------------------------------------------------- the connection

def test_an_idle_client_survives_a_daemon_restart(gateways, tmp_path):
    d = Daemon(gateways=gateways, transports=("fcm",), directory=str(tmp_path / "d"))
    try:
        with Client(d.socket) as herald:
            herald.device_register(user="c-restart", platform="fcm", token="c-restart-1")
            d.shutdown()
            d.start()
            (device,) = herald.device_list(user="c-restart")["devices"]
            assert device["token_hash"] == token_hash("c-restart-1")
        d.shutdown()
    finally:
        d.cleanup()


def test_web_push_keys_as_any_mapping(daemon, gw):
    from types import MappingProxyType

    with Client(daemon.socket) as herald:
        sub = gw.subscription()
        keys = MappingProxyType({"p256dh": sub["p256dh"], "auth": sub["auth"]})
        reg = herald.device_register(user="c-web", platform="web", token=sub["endpoint"], keys=keys)
        assert reg["created"] is True
        sent = herald.push_send(to={"devices": (reg["device_id"],)}, wait=True)
        assert sent["counts"]["delivered"] == 1, sent


def test_a_block_that_raises_sends_none_of_its_calls_later(daemon):
    with Client(daemon.socket) as herald:
        with pytest.raises(KeyError):
            with herald.pipeline() as p:
                queued = p.device_register(user="c-raise", platform="fcm", token="c-raise-1")
                raise KeyError("the app changed its mind")
        with pytest.raises(herald_client.ConnectionLost):
            queued.result()
        # Not written with the next call either (it was only queued: 60 bytes, under the
        # pipeline's write threshold).
        assert herald.device_list(user="c-raise") == {"devices": []}
        time.sleep(0.2)
        assert herald.device_list(user="c-raise") == {"devices": []}


def test_overloaded_when_this_uid_holds_every_connection_it_may():
    d = Daemon(transports=(), server={"max_connections_per_uid": 2})
    held = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            held.append(s)
        with Client(d.socket) as herald:
            with pytest.raises(herald_client.Overloaded) as refused:
                herald.system_health()
            assert refused.value.code == 1007 and refused.value.retry_after is not None
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the daemon sees the close on its next turn
                try:
                    assert herald.system_health()["status"] == "ok"
                    break
                except herald_client.Overloaded:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
    finally:
        for s in held:
            s.close()
        d.cleanup()
