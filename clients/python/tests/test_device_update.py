"""herald_client's ``device_update`` against a real daemon and the provider test gateways
(conftest.py): a rename and a turn-off by id reach the daemon as given (``enabled=False`` is
sent, not dropped as a left-out argument), device.list shows ``enabled`` next to
``bundle_id``, a send skips the disabled device (``device_disabled``) and delivers to the
others, and the errors arrive as NotFound (with ``data.device_id``) and InvalidParams.
"""

from __future__ import annotations

import pytest

from herald_client import Client, InvalidParams, NotFound
from herald_fixtures import TOPIC, hex_token


def test_rename_disable_and_enable_by_id(daemon, gw):
    token = hex_token(1, prefix=0xD1)
    with Client(daemon.socket) as herald:
        apns = herald.device_register(user="c-upd", platform="apns", token=token, bundle_id=TOPIC, name="iPad")
        fcm = herald.device_register(user="c-upd", platform="fcm", token="c-upd-fcm")

        renamed = herald.device_update(user="c-upd", device_id=apns["device_id"], name="Kitchen iPad")
        assert renamed["device"]["device_id"] == apns["device_id"]
        assert renamed["device"]["name"] == "Kitchen iPad" and renamed["device"]["enabled"] is True

        off = herald.device_update(user="c-upd", device_id=apns["device_id"], enabled=False)["device"]
        assert off["enabled"] is False and off["name"] == "Kitchen iPad" and off["bundle_id"] == TOPIC
        listed = {d["device_id"]: d for d in herald.device_list(user="c-upd")["devices"]}
        assert listed[apns["device_id"]] == off
        assert listed[fcm["device_id"]]["enabled"] is True and listed[fcm["device_id"]]["bundle_id"] is None

        sent = herald.push_send(to={"users": ["c-upd"]}, wait=True, timeout_ms=20000)
        assert sent["devices"] == 1 and sent["skipped"] == 1, sent
        assert sent["counts"]["delivered"] == 1 and sent["counts"]["skipped"] == 1, sent
        status = herald.push_status(message_id=sent["message_id"], detail=True)
        reasons = {d["device_id"]: (d["state"], d.get("reason")) for d in status["devices"]}
        assert reasons[apns["device_id"]] == ("skipped", "device_disabled")
        assert reasons[fcm["device_id"]][0] == "delivered"
        assert gw.received("apns", token=token) == []

        on = herald.device_update(user="c-upd", device_id=apns["device_id"], enabled=True)["device"]
        assert on["enabled"] is True
        again = herald.push_send(to={"devices": [apns["device_id"]]}, wait=True, timeout_ms=20000)
        assert again["counts"]["delivered"] == 1, again
        (record,) = gw.received("apns", token=token)
        assert record["headers"]["apns-topic"] == TOPIC


def test_errors_name_the_device_or_the_field(daemon):
    with Client(daemon.socket) as herald:
        mine = herald.device_register(user="c-upd-err", platform="fcm", token="c-upd-err-1")
        unknown = "0" * 32
        with pytest.raises(NotFound) as missing:
            herald.device_update(user="c-upd-err", device_id=unknown, enabled=False)
        assert missing.value.data["device_id"] == unknown
        # Another user's device is not this user's to change.
        with pytest.raises(NotFound):
            herald.device_update(user="c-upd-other", device_id=mine["device_id"], enabled=False)
        with pytest.raises(InvalidParams) as neither:
            herald.device_update(user="c-upd-err", device_id=mine["device_id"])
        assert neither.value.field == "name"
        with pytest.raises(InvalidParams) as malformed:
            herald.device_update(user="c-upd-err", device_id="not-an-id", name="x")
        assert malformed.value.field == "device_id"
        (device,) = herald.device_list(user="c-upd-err")["devices"]
        assert device["enabled"] is True and device["name"] is None


def test_device_update_in_a_pipeline(daemon):
    with Client(daemon.socket) as herald:
        registered = herald.device_register(user="c-upd-p", platform="fcm", token="c-upd-p-1")
        with herald.pipeline() as p:
            off = p.device_update(user="c-upd-p", device_id=registered["device_id"], enabled=False, name="")
            refused = p.device_update(user="c-upd-p", device_id="f" * 32, enabled=True)
            listed = p.device_list(user="c-upd-p")
        assert off.result()["device"]["enabled"] is False and off.result()["device"]["name"] == ""
        assert isinstance(refused.exception(), NotFound)
        assert listed.result()["devices"] == [off.result()["device"]]


def test_update_by_id_alone(daemon):
    with Client(daemon.socket) as herald:
        mine = herald.device_register(user="c-upd-id", platform="fcm", token="c-upd-id-1")
        off = herald.device_update(device_id=mine["device_id"], enabled=False)["device"]
        assert off["device_id"] == mine["device_id"] and off["enabled"] is False
        (listed,) = herald.device_list(user="c-upd-id")["devices"]
        assert listed["enabled"] is False
        with pytest.raises(NotFound):
            herald.device_update(device_id="1" * 32, enabled=True)
