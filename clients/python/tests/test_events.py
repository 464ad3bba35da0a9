"""``Client.events``: the event stream as an iterator that resumes by cursor.

Against a real daemon (conftest.py): the delivery and message_complete events of a push, from
now and from a cursor; refused subscriptions raise; a daemon restart mid-stream costs nothing.
Against a scripted socket (ScriptedDaemon): a ``slow`` gap is read again from its cursor on a
new connection, a ``retention`` gap is yielded, a lost connection resumes from the last cursor.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

import pytest

from herald_client import Client, ConnectFailed, EventStream, InvalidParams
from herald_fixtures import Daemon


def until_complete(stream: EventStream, message_ids: set[str], limit: float = 20.0) -> list[dict]:
    """Events read until every message of ``message_ids`` has its message_complete."""
    seen: list[dict] = []
    deadline = time.monotonic() + limit
    waiting = set(message_ids)
    while waiting:
        assert time.monotonic() < deadline, f"no message_complete for {waiting}; read {seen}"
        stream.idle_timeout = max(0.01, deadline - time.monotonic())
        event = next(stream, None)
        if event is None:
            continue
        seen.append(event)
        if event["kind"] == "message_complete":
            waiting.discard(event["message_id"])
    return seen


# ----------------------------------------------------------------------------- a real daemon

def test_a_push_gives_its_deliveries_and_its_completion(daemon, gw):
    with Client(daemon.socket) as herald:
        herald.device_register(user="e-push", platform="fcm", token="e-push-1")
        herald.device_register(user="e-push", platform="fcm", token="e-push-2")
        with herald.events(kinds=["delivery", "message_complete"]) as stream:
            start = stream.cursor
            assert isinstance(start, str)
            sent = herald.push_send(to={"users": ["e-push"]})
            events = [e for e in until_complete(stream, {sent["message_id"]})
                      if e.get("message_id") == sent["message_id"]]
        deliveries = [e for e in events if e["kind"] == "delivery"]
        assert len(deliveries) == 2 and events[-1]["kind"] == "message_complete"
        for e in deliveries:
            assert e["state"] == "delivered" and e["platform"] == "fcm" and e["user"] == "e-push"
            assert e["http_status"] == 200 and e["reason"] is None and e["app"] == "default"
            assert e["provider_id"], e  # the message name FCM answered with
            assert e["at"].endswith("Z") and e["cursor"]
        assert events[-1]["counts"].get("delivered") == 2
        assert stream.cursor == events[-1]["cursor"]

        # From the cursor the first stream started at: the same events again.
        with herald.events(since=start, kinds=["delivery", "message_complete"], idle_timeout=1.0) as again:
            replayed = [e for e in again if e.get("message_id") == sent["message_id"]]
        assert [e["cursor"] for e in replayed] == [e["cursor"] for e in events]


def test_a_refused_subscription_raises_at_once(daemon, tmp_path):
    with Client(daemon.socket) as herald:
        with pytest.raises(InvalidParams) as bad:
            herald.events(kinds=["delivery", "bogus"])
        assert bad.value.field == "kinds[1]"
        with pytest.raises(InvalidParams):
            herald.events(since="yesterday")
    with pytest.raises(ConnectFailed):
        EventStream(str(tmp_path / "none.sock"))


def test_idle_timeout_ends_iteration_and_iterating_again_goes_on(daemon, gw):
    with Client(daemon.socket) as herald:
        herald.device_register(user="e-idle", platform="fcm", token="e-idle-1")
        with herald.events(kinds=["message_complete"], idle_timeout=0.2) as stream:
            t0 = time.monotonic()
            assert list(stream) == []
            assert 0.2 <= time.monotonic() - t0 < 2
            sent = herald.push_send(to={"users": ["e-idle"]})
            assert sent["message_id"] in {e["message_id"] for e in until_complete(stream, {sent["message_id"]})}


def test_a_daemon_restart_mid_stream_misses_nothing(gateways, tmp_path):
    d = Daemon(gateways=gateways, transports=("fcm",), directory=str(tmp_path / "d"))
    try:
        with Client(d.socket) as herald:
            herald.device_register(user="e-restart", platform="fcm", token="e-restart-1")
            stream = herald.events(kinds=["delivery", "message_complete"])
            first = herald.push_send(to={"users": ["e-restart"]})["message_id"]
            until_complete(stream, {first})
            d.shutdown()
            d.start()
            # Sent while the stream's connection is gone (it has not read since).
            later = [herald.push_send(to={"users": ["e-restart"]})["message_id"] for _ in range(3)]
            seen = until_complete(stream, set(later))
            assert stream.resubscribed >= 1
            for m in later:
                kinds = [e["kind"] for e in seen if e.get("message_id") == m]
                assert kinds == ["delivery", "message_complete"], (m, seen)
            stream.close()
        d.shutdown()
    finally:
        d.cleanup()


def test_a_reader_that_falls_behind_still_gets_every_event(tmp_path):
    """The daemon's smallest buffer and a stream not read while 60 pushes to 20 devices are
    accepted (skipped at once: no credentials): past the socket's buffers the daemon drops what
    waits and sends a slow gap, and the stream reads the skipped events again."""
    d = Daemon(transports=(), server={"event_buffer_bytes": 65536}, directory=str(tmp_path / "d"))
    try:
        with Client(d.socket) as herald:
            for i in range(20):
                herald.device_register(user="e-slow", platform="fcm", token=f"e-slow-{i}")
            with herald.events(kinds=["delivery", "message_complete"]) as stream:
                with herald.pipeline() as p:
                    calls = [p.push_send(to={"users": ["e-slow"]}) for _ in range(60)]
                sent = {c.result()["message_id"] for c in calls}
                seen = until_complete(stream, sent)
                assert d.log_lines("events_gap"), "the stream never fell behind: the test proves nothing"
                assert stream.resubscribed >= 1
        per_message: dict[str, set[str]] = {}
        for e in seen:
            if e["kind"] == "delivery":
                per_message.setdefault(e["message_id"], set()).add(e["device_id"])
        assert set(per_message) == sent and all(len(devices) == 20 for devices in per_message.values())
        d.shutdown()
    finally:
        d.cleanup()


def test_the_daemons_slow_gap_names_the_last_event_written_before_it(tmp_path):
    """What a reader of the bare protocol relies on to replay from a slow gap: its cursor is
    that of the last event the connection got before it ("0" when it got none)."""
    d = Daemon(transports=(), server={"event_buffer_bytes": 65536}, directory=str(tmp_path / "d"))
    try:
        with Client(d.socket) as herald:
            for i in range(20):
                herald.device_register(user="e-gap", platform="fcm", token=f"e-gap-{i}")
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # A small buffer on this side; the 4,200 events below are several times what the
            # daemon's socket buffer, its unsent output and event_buffer_bytes hold together.
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect(d.socket)
            raw.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe","params":{}}\n')
            reader = raw.makefile("rb")
            started = json.loads(reader.readline())["result"]["cursor"]
            with herald.pipeline() as p:
                for _ in range(200):
                    p.push_send(to={"users": ["e-gap"]})
            raw.settimeout(10)
            last, gap = started or "0", None
            while gap is None:
                batch = json.loads(reader.readline())["params"]["events"]
                for e in batch:
                    if e["kind"] == "gap":
                        assert len(batch) == 1 and e["reason"] == "slow", batch
                        gap = e
                    else:
                        last = e["cursor"]
            assert gap["cursor"] == last
            reader.close()
            raw.close()
        d.shutdown()
    finally:
        d.cleanup()


# ----------------------------------------------------------------------------- a scripted socket

def event(cursor: int, kind: str = "delivery") -> dict:
    return {"cursor": str(cursor), "kind": kind, "at": "2026-12-07T10:00:00.000Z", "app": "default"}


def notification(*events: dict) -> dict:
    return {"jsonrpc": "2.0", "method": "events", "params": {"cursor": events[-1]["cursor"], "events": list(events)}}


class ScriptedDaemon:
    """A Unix socket that answers each connection's events.subscribe with the script's next
    function: it gets the subscription's params and returns the lines to send (the answer is
    sent first); ``keep`` leaves the connection open after them."""

    def __init__(self, path: str, script: list[Callable[[dict], tuple[list[dict], bool]]]) -> None:
        self.path, self.script = path, list(script)
        self.subscriptions: list[dict] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for c in self._open:
            c.close()

    def _serve(self) -> None:
        while self.script:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            line = b""
            while not line.endswith(b"\n"):
                line += conn.recv(4096)
            request = json.loads(line)
            self.subscriptions.append(request["params"])
            lines, keep = self.script.pop(0)(request["params"])
            since = request["params"].get("since")
            answer = {"jsonrpc": "2.0", "id": request["id"],
                      "result": {"cursor": since or "4", "apps": ["default"], "kinds": []}}
            conn.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in [answer, *lines]))
            if keep:
                self._open.append(conn)
            else:
                conn.close()


def cursors(stream: EventStream) -> list[str]:
    return [e["cursor"] if e["kind"] != "gap" else f"gap:{e['reason']}:{e['cursor']}" for e in stream]


def test_a_slow_gap_is_read_again_from_its_cursor(tmp_path):
    path = str(tmp_path / "s.sock")
    fake = ScriptedDaemon(path, [
        # Live: 5 and 6, then the daemon skips (7, 8 never written), a gap at 6, then 9 live.
        lambda p: ([notification(event(5), event(6)),
                    notification({"kind": "gap", "cursor": "6", "reason": "slow"}),
                    notification(event(9))], True),
        # The replay from 6: the skipped ones and what came after.
        lambda p: ([notification(event(7), event(8), event(9)), notification(event(10))], True),
    ])
    try:
        with EventStream(path, idle_timeout=0.5) as stream:
            assert cursors(stream) == ["5", "6", "7", "8", "9", "10"]
            assert stream.cursor == "10" and stream.resubscribed == 1
        assert [s.get("since") for s in fake.subscriptions] == [None, "6"]
    finally:
        fake.close()


def test_a_retention_gap_is_yielded(tmp_path):
    path = str(tmp_path / "s.sock")
    fake = ScriptedDaemon(path, [
        lambda p: ([notification({"kind": "gap", "cursor": "40", "reason": "retention"}),
                    notification(event(41))], True),
    ])
    try:
        with EventStream(path, since="3", idle_timeout=0.5) as stream:
            assert cursors(stream) == ["gap:retention:40", "41"]
        assert fake.subscriptions == [{"since": "3"}]
    finally:
        fake.close()


def test_a_lost_connection_resubscribes_from_the_last_cursor(tmp_path):
    path = str(tmp_path / "s.sock")
    fake = ScriptedDaemon(path, [
        lambda p: ([notification(event(5), event(6))], False),  # then closed
        lambda p: ([notification(event(7))], False),
        lambda p: ([], True),
    ])
    try:
        with EventStream(path, app="default", kinds=["delivery"], idle_timeout=0.5) as stream:
            assert cursors(stream) == ["5", "6", "7"]
        assert fake.subscriptions == [
            {"app": "default", "kinds": ["delivery"]},
            {"app": "default", "kinds": ["delivery"], "since": "6"},
            {"app": "default", "kinds": ["delivery"], "since": "7"},
        ]
    finally:
        fake.close()


def test_reconnects_with_backoff_until_the_socket_is_back(tmp_path):
    path = str(tmp_path / "s.sock")
    fake = ScriptedDaemon(path, [lambda p: ([notification(event(5))], False)])
    stream = EventStream(path, idle_timeout=0.3, max_backoff=0.1)
    assert next(stream)["cursor"] == "5"
    fake.close()
    os.unlink(path)
    # Nothing there: iteration ends at the idle timeout, still trying.
    assert list(stream) == []
    fake = ScriptedDaemon(path, [lambda p: ([notification(event(6))], True)])
    try:
        stream.idle_timeout = 5
        assert next(stream)["cursor"] == "6"
        assert fake.subscriptions == [{"since": "5"}]
        stream.close()
        assert list(stream) == []
    finally:
        fake.close()
