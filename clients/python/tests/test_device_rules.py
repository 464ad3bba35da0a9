"""herald_client and each device's own rules (docs/interface.md, "Each device's own rules").

Against a scripted socket: what ``device_register``, ``device_update`` and ``push_send`` put on
the wire: a rule left out (``UNSET``) is not sent, ``None`` is sent as null (it clears the rule),
``not_before`` as an aware datetime becomes RFC 3339 UTC, a naive one is refused before anything
is sent. Against a real daemon and the provider test gateways: the rules are listed and
cleared, a message's topics skip the devices that do not want them, ``not_before`` and
``at_local`` hold deliveries (``held`` with ``due_at`` and ``timing``, also in the event
stream), and quiet hours hold, silence or drop a push unless it breaks through.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import socket
import threading
import zoneinfo
from collections.abc import Iterator

import pytest

from herald_client import UNSET, Client, InvalidParams
from herald_fixtures import TOPIC, Daemon, hex_token

UTC = datetime.timezone.utc


# ----------------------------------------------------------------------------- a scripted socket

class AnsweringSocket:
    """A Unix socket that answers every request with an empty result and keeps the requests."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[dict] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def params(self) -> list[dict | None]:
        return [r.get("params") for r in self.requests]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._converse, args=(conn,), daemon=True).start()

    def _converse(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while data := conn.recv(65536):
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    request = json.loads(line)
                    self.requests.append(request)
                    if "id" in request:
                        conn.sendall(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {}}).encode()
                                     + b"\n")


@pytest.fixture()
def scripted(tmp_path) -> Iterator[AnsweringSocket]:
    fake = AnsweringSocket(str(tmp_path / "s.sock"))
    try:
        yield fake
    finally:
        fake.close()


DEVICE = "07dada258e877bf00e12e921d46d5ab0"


def test_device_rules_left_out_set_or_cleared(scripted):
    with Client(scripted.path) as herald:
        herald.device_update(device_id=DEVICE, name="Pixel")
        herald.device_update(device_id=DEVICE, time_zone="Europe/Paris",
                             quiet_hours={"start": "22:00", "end": "07:00", "days": ["fri", "sat"]},
                             during="silent", topics=("mention", "mailbox:inbox"))
        herald.device_update(user="alice", device_id=DEVICE, time_zone=None, quiet_hours=None, topics=None)
        herald.device_update(device_id=DEVICE, topics=[], time_zone=UNSET, name=None, enabled=None)
        herald.device_register(user="alice", platform="fcm", token="t", name=None)
        herald.device_register(user="alice", platform="fcm", token="t", time_zone="UTC",
                               quiet_hours={"start": "23:00", "end": "06:00", "during": "drop"}, topics=None)
    assert scripted.params() == [
        {"device_id": DEVICE, "name": "Pixel"},
        {"device_id": DEVICE, "time_zone": "Europe/Paris",
         "quiet_hours": {"start": "22:00", "end": "07:00", "days": ["fri", "sat"]}, "during": "silent",
         "topics": ["mention", "mailbox:inbox"]},
        {"user": "alice", "device_id": DEVICE, "time_zone": None, "quiet_hours": None, "topics": None},
        {"device_id": DEVICE, "topics": []},
        {"user": "alice", "platform": "fcm", "token": "t"},
        {"user": "alice", "platform": "fcm", "token": "t", "time_zone": "UTC",
         "quiet_hours": {"start": "23:00", "end": "06:00", "during": "drop"}, "topics": None},
    ]


def test_the_same_in_a_pipeline(scripted):
    with Client(scripted.path) as herald:
        with herald.pipeline() as p:
            p.device_update(device_id=DEVICE, time_zone=None)
            p.device_register(user="bob", platform="fcm", token="t", topics=["mention"])
            p.push_send(to={"users": ["bob"]}, topics=["mention"], at_local="09:00")
    assert scripted.params() == [
        {"device_id": DEVICE, "time_zone": None},
        {"user": "bob", "platform": "fcm", "token": "t", "topics": ["mention"]},
        {"to": {"users": ["bob"]}, "topics": ["mention"], "at_local": "09:00"},
    ]


def test_send_topics_and_send_time(scripted):
    paris = datetime.timezone(datetime.timedelta(hours=1))
    with Client(scripted.path) as herald:
        herald.push_send(to={"users": ["a"]}, topics=None, not_before=None, at_local=None)
        herald.push_send(to={"users": ["a"]}, topics=["mention"],
                         not_before=datetime.datetime(2026, 12, 24, 9, 0, 0, 123456, tzinfo=paris))
        herald.push_send(to={"users": ["a"]}, not_before=datetime.datetime(2026, 12, 24, 8, 0, tzinfo=UTC))
        herald.push_send(to={"users": ["a"]}, not_before="2026-12-24T09:00:00+01:00")
        herald.push_send(to={"devices": [DEVICE]}, at_local="09:00", ttl=90000, collapse_key="digest")
        # A naive datetime has no instant: refused before anything is sent.
        with pytest.raises(ValueError, match="aware"):
            herald.push_send(to={"users": ["a"]}, not_before=datetime.datetime(2026, 12, 24, 9, 0))
    assert scripted.params() == [
        {"to": {"users": ["a"]}},
        {"to": {"users": ["a"]}, "topics": ["mention"], "not_before": "2026-12-24T08:00:00.123Z"},
        {"to": {"users": ["a"]}, "not_before": "2026-12-24T08:00:00.000Z"},
        {"to": {"users": ["a"]}, "not_before": "2026-12-24T09:00:00+01:00"},
        {"to": {"devices": [DEVICE]}, "at_local": "09:00", "ttl": 90000, "collapse_key": "digest"},
    ]


def test_unset_is_exported_and_says_what_it_is():
    assert repr(UNSET) == "UNSET"
    for name in ("time_zone", "quiet_hours", "topics"):
        assert inspect.signature(Client.device_update).parameters[name].default is UNSET
        assert inspect.signature(Client.device_register).parameters[name].default is UNSET
    assert inspect.signature(Client.push_send).parameters["topics"].default is None


# ----------------------------------------------------------------------------- a real daemon

@pytest.fixture(scope="module")
def rules_daemon(gateways) -> Iterator[Daemon]:
    """The gateways' daemon of conftest.py, with ``security`` among the bypass topics."""
    d = Daemon(gateways=gateways, app_default_extra="quiet_hours_bypass_topics = security\n")
    try:
        yield d
    finally:
        d.cleanup()


def detail(herald: Client, message_id: str) -> dict:
    """The message's only device entry of push.status with detail."""
    (entry,) = herald.push_status(message_id=message_id, detail=True)["devices"]
    return entry


def parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def clock(moment: datetime.datetime) -> str:
    return moment.strftime("%H:%M")


def test_rules_are_listed_and_cleared(rules_daemon):
    with Client(rules_daemon.socket) as herald:
        reg = herald.device_register(user="c-rules", platform="fcm", token="c-rules-1", time_zone="Europe/Paris",
                                     quiet_hours={"start": "22:00", "end": "07:00", "days": ["sat", "fri"]},
                                     topics=["mention", "mailbox:inbox"])
        (device,) = herald.device_list(user="c-rules")["devices"]
        assert device["time_zone"] == "Europe/Paris"
        assert device["quiet_hours"] == {"start": "22:00", "end": "07:00", "days": ["fri", "sat"], "during": "hold"}
        assert device["topics"] == ["mention", "mailbox:inbox"]

        # Registering the token again without the rules keeps them.
        herald.device_register(user="c-rules", platform="fcm", token="c-rules-1", app_version="2")
        (again,) = herald.device_list(user="c-rules")["devices"]
        assert again["quiet_hours"] == device["quiet_hours"] and again["topics"] == device["topics"]

        updated = herald.device_update(device_id=reg["device_id"], quiet_hours={"start": "23:00", "end": "06:30"},
                                       during="silent", topics=[])["device"]
        assert updated["quiet_hours"] == {"start": "23:00", "end": "06:30", "days": None, "during": "silent"}
        assert updated["topics"] == [] and updated["time_zone"] == "Europe/Paris"

        # Quiet hours need a time zone: clearing it alone is refused, and nothing changes.
        with pytest.raises(InvalidParams) as orphaned:
            herald.device_update(device_id=reg["device_id"], time_zone=None)
        assert orphaned.value.field == "time_zone"
        with pytest.raises(InvalidParams) as unknown:
            herald.device_update(device_id=reg["device_id"], time_zone="Mars/Olympus_Mons")
        assert unknown.value.field == "time_zone"
        assert herald.device_list(user="c-rules")["devices"] == [updated]

        cleared = herald.device_update(device_id=reg["device_id"], time_zone=None, quiet_hours=None,
                                       topics=None)["device"]
        assert (cleared["time_zone"], cleared["quiet_hours"], cleared["topics"]) == (None, None, None)


def test_a_message_reaches_the_devices_that_want_its_topics(rules_daemon):
    with Client(rules_daemon.socket) as herald:
        wants = herald.device_register(user="c-topics", platform="fcm", token="c-topics-1", topics=["mention"])
        every = herald.device_register(user="c-topics", platform="fcm", token="c-topics-2")
        sent = herald.push_send(to={"users": ["c-topics"]}, topics=["billing"], wait=True, timeout_ms=20000)
        assert sent["devices"] == 1 and sent["skipped"] == 1, sent
        entries = {d["device_id"]: d for d in herald.push_status(message_id=sent["message_id"], detail=True)["devices"]}
        assert (entries[wants["device_id"]]["state"], entries[wants["device_id"]]["reason"]) == ("skipped",
                                                                                                  "not_subscribed")
        assert entries[every["device_id"]]["state"] == "delivered"
        assert entries[every["device_id"]]["timing"] == [] and entries[every["device_id"]]["due_at"] is None

        shared = herald.push_send(to={"users": ["c-topics"]}, topics=["mention", "billing"], wait=True,
                                  timeout_ms=20000)
        assert shared["counts"]["delivered"] == 2, shared


def test_not_before_holds_the_delivery_and_says_so(rules_daemon, gw):
    due = (datetime.datetime.now(UTC) + datetime.timedelta(hours=2)).replace(microsecond=0)
    with Client(rules_daemon.socket) as herald:
        reg = herald.device_register(user="c-later", platform="fcm", token="c-later-1")
        with herald.events(kinds=["delivery"], idle_timeout=5) as stream:
            sent = herald.push_send(to={"users": ["c-later"]}, not_before=due, collapse_key="later")
            held = next(e for e in stream if e.get("message_id") == sent["message_id"])
        assert held["state"] == "held" and held["device_id"] == reg["device_id"]
        assert parse(held["due_at"]) == due and held["timing"] == ["not_before"]

        status = herald.push_status(message_id=sent["message_id"], detail=True)
        assert status["state"] == "pending" and status["counts"]["held"] == 1, status
        (entry,) = status["devices"]
        assert entry["state"] == "held" and parse(entry["due_at"]) == due and entry["timing"] == ["not_before"]
        assert gw.received("fcm", token="c-later-1") == []

        assert herald.push_cancel(message_id=sent["message_id"]) == {"cancelled": 1}
        after = detail(herald, sent["message_id"])
        assert (after["state"], after["reason"]) == ("skipped", "cancelled")


def test_at_local_reads_each_devices_own_clock(rules_daemon):
    zone = zoneinfo.ZoneInfo("Asia/Kolkata")
    at = clock(datetime.datetime.now(zone) + datetime.timedelta(hours=3))
    with Client(rules_daemon.socket) as herald:
        local = herald.device_register(user="c-local", platform="fcm", token="c-local-1", time_zone="Asia/Kolkata")
        zoneless = herald.device_register(user="c-local", platform="fcm", token="c-local-2")
        sent = herald.push_send(to={"users": ["c-local"]}, at_local=at, wait=True, timeout_ms=3000)
        entries = {d["device_id"]: d for d in herald.push_status(message_id=sent["message_id"], detail=True)["devices"]}
        held = entries[local["device_id"]]
        assert held["state"] == "held" and held["timing"] == ["at_local"], held
        due = parse(held["due_at"])
        assert clock(due.astimezone(zone)) == at
        assert datetime.timedelta(0) < due - datetime.datetime.now(UTC) <= datetime.timedelta(hours=24)
        # Without a time zone: sent at once, and the status says why.
        now = entries[zoneless["device_id"]]
        assert now["state"] == "delivered" and now["timing"] == ["at_local:no_time_zone"] and now["due_at"] is None
        herald.push_cancel(message_id=sent["message_id"])


def quiet_now() -> tuple[dict, datetime.datetime]:
    """Quiet hours in UTC from an hour ago to an hour ahead; the instant they end."""
    now = datetime.datetime.now(UTC)
    end = (now + datetime.timedelta(hours=1)).replace(second=0, microsecond=0)
    return {"start": clock(now - datetime.timedelta(hours=1)), "end": clock(end)}, end


def test_quiet_hours_hold_silence_or_drop_unless_a_push_breaks_through(rules_daemon, gw):
    quiet, end = quiet_now()
    token = hex_token(1, prefix=0xC7)
    with Client(rules_daemon.socket) as herald:
        reg = herald.device_register(user="c-quiet", platform="apns", token=token, bundle_id=TOPIC, time_zone="UTC",
                                     quiet_hours=dict(quiet, during="hold"))
        sent = herald.push_send(to={"users": ["c-quiet"]}, collapse_key="quiet")
        held = detail(herald, sent["message_id"])
        assert held["state"] == "held" and held["timing"] == ["quiet_hours:hold"], held
        assert parse(held["due_at"]) == end
        herald.push_cancel(message_id=sent["message_id"])

        for breaks, note in (({"interruption_level": "critical"}, "quiet_hours:bypassed:critical"),
                             ({"topics": ["security"]}, "quiet_hours:bypassed:topic:security")):
            through = herald.push_send(to={"users": ["c-quiet"]}, wait=True, timeout_ms=20000, **breaks)
            entry = detail(herald, through["message_id"])
            assert entry["state"] == "delivered" and entry["timing"] == [note], entry

        herald.device_update(device_id=reg["device_id"], quiet_hours=dict(quiet, during="silent"))
        gw.reset()
        silent = herald.push_send(to={"users": ["c-quiet"]}, wait=True, timeout_ms=20000)
        entry = detail(herald, silent["message_id"])
        assert entry["state"] == "delivered" and entry["timing"] == ["quiet_hours:silent"], entry
        (record,) = gw.received("apns", token=token)
        assert record["body"]["aps"].get("interruption-level") == "passive" and "sound" not in record["body"]["aps"]

        herald.device_update(device_id=reg["device_id"], during="drop", quiet_hours=quiet)
        dropped = herald.push_send(to={"users": ["c-quiet"]}, wait=True, timeout_ms=20000)
        assert dropped["skipped"] == 1, dropped
        entry = detail(herald, dropped["message_id"])
        assert (entry["state"], entry["reason"], entry["timing"]) == ("skipped", "quiet_hours", ["quiet_hours:drop"])


def test_the_daemon_refuses_what_does_not_go_together(rules_daemon):
    with Client(rules_daemon.socket) as herald:
        herald.device_register(user="c-refuse", platform="fcm", token="c-refuse-1")
        with pytest.raises(InvalidParams) as both:
            herald.push_send(to={"users": ["c-refuse"]}, not_before="2026-12-24T09:00:00Z", at_local="09:00")
        assert both.value.field == "at_local"
        with pytest.raises(InvalidParams) as far:
            herald.push_send(to={"users": ["c-refuse"]},
                             not_before=datetime.datetime.now(UTC) + datetime.timedelta(days=40))
        assert far.value.field == "not_before"
        with pytest.raises(InvalidParams) as no_zone:
            herald.device_register(user="c-refuse", platform="fcm", token="c-refuse-1",
                                   quiet_hours={"start": "22:00", "end": "07:00"})
        assert no_zone.value.field == "quiet_hours"
