"""herald_client's ``push_send`` with ``web_payload`` and ``shrink`` against a real daemon and the
Web Push test gateway (conftest.py): the record decrypts to the payload shrunk by the steps,
``push_status`` shows ``shrunk``, the legacy APNs body carries none of it, and a bad step is
InvalidParams naming it, on a Client and in a Pipeline.
"""

from __future__ import annotations

import json

import pytest

from herald_client import Client, InvalidParams, PayloadTooLarge
from herald_fixtures import hex_token

SHRINK = [{"drop": ["/media"]}, {"shorten": "/body"}, {"keep": ["/type"]}]


def test_web_payload_is_sealed_shrunk_and_reported(daemon, gw):
    with Client(daemon.socket) as herald:
        token = hex_token(1, prefix=0xE7)
        herald.device_register(user="c-wp", platform="apns", token=token)
        sub = gw.subscription()
        web = herald.device_register(user="c-wp", platform="web", token=sub["endpoint"], keys=gw.web_keys(sub))
        payload = {"type": "message", "body": "hello Zoë", "media": "m" * 3000}
        sent = herald.push_send(
            to={"users": ["c-wp"]}, web_payload=payload, shrink=SHRINK, wait=True, timeout_ms=20000
        )
        assert sent["counts"]["delivered"] == 2, sent
        (pushed,) = gw.received("webpush", token=sub["id"])
        assert json.loads(pushed["plaintext"]) == {"type": "message", "body": "hello Zoë"}
        status = herald.push_status(message_id=sent["message_id"], detail=True)
        shrunk = {d["device_id"]: d["shrunk"] for d in status["devices"]}
        assert shrunk[web["device_id"]] == 0
        assert [d["shrunk"] for d in status["devices"] if d["device_id"] != web["device_id"]] == [None]
        (apns,) = gw.received("apns", token=token)
        assert "Zo" not in json.dumps(apns["body"]) and "hello" not in json.dumps(apns["body"])


def test_bad_steps_and_a_payload_no_step_fits(daemon):
    with Client(daemon.socket) as herald:
        with pytest.raises(InvalidParams) as bad:
            herald.push_send(to={"users": ["c-wp2"]}, web_payload={"a": 1}, shrink=[{"drop": ["/a"]}, {"shorten": "a"}])
        assert bad.value.data["field"] == "shrink[1].shorten"
        with pytest.raises(PayloadTooLarge) as big:
            herald.push_send(to={"users": ["c-wp2"]}, web_payload={"a": "x" * 3000}, shrink=[{"drop": ["/b"]}])
        assert big.value.data["limit"] == 2713
        with herald.pipeline() as p:
            ok = p.push_send(to={"users": ["c-wp2"]}, web_payload={"a": 1}, shrink=[{"keep": ["/a"]}])
            refused = p.push_send(to={"users": ["c-wp2"]}, shrink=[{"keep": ["/a"]}])
        assert ok.result()["devices"] == 0
        missing = refused.exception()
        assert isinstance(missing, InvalidParams) and missing.data["field"] == "shrink"


def test_declarative_notification_and_apns_only_kinds(daemon, gw):
    """``notification`` builds the Declarative Web Push record; ``kind="widgets"`` reaches an
    ``apns_widgets`` registration only; a declarative payload without ``navigate`` is refused."""
    with Client(daemon.socket) as herald:
        sub = gw.subscription()
        herald.device_register(user="c-dwp", platform="web", token=sub["endpoint"], keys=gw.web_keys(sub))
        widget = hex_token(2, prefix=0xE8)
        herald.device_register(user="c-dwp", platform="apns_widgets", token=widget)
        sent = herald.push_send(
            to={"users": ["c-dwp"]},
            notification={"title": "Zoë", "navigate": "https://chat.example/c/7", "app_badge": 2},
            wait=True, timeout_ms=20000)
        assert sent["counts"]["delivered"] == 1 and sent["skipped"] == 1, sent
        (pushed,) = gw.received("webpush", token=sub["id"])
        assert json.loads(pushed["plaintext"]) == {
            "web_push": 8030, "notification": {"title": "Zoë", "navigate": "https://chat.example/c/7", "app_badge": 2}}
        reload = herald.push_send(to={"users": ["c-dwp"]}, kind="widgets", wait=True, timeout_ms=20000)
        assert reload["counts"]["delivered"] == 1 and reload["skipped"] == 1, reload
        (apns,) = gw.received("apns", token=widget)
        assert apns["body"] == {"aps": {"content-changed": True}}
        assert apns["headers"]["apns-push-type"] == "widgets"
        with pytest.raises(InvalidParams) as bad:
            herald.push_send(to={"users": ["c-dwp"]}, web_payload={"web_push": 8030, "notification": {"title": "t"}})
        assert bad.value.data["field"] == "web_payload.notification.navigate"
