"""herald_client's Live Activity calls against a real daemon and the APNs test gateway
(conftest.py): ``activity_register`` in both forms, ``push_send(kind="live_activity")`` through a
start, an update and an end, ``activity_list`` and ``activity_unregister``, and bad input as
InvalidParams naming the field, on a Client and in a Pipeline.
"""

from __future__ import annotations

import pytest

from herald_client import Client, InvalidParams
from herald_fixtures import TOPIC, hex_token


def test_a_live_activity_through_the_client(daemon, gw):
    with Client(daemon.socket) as herald:
        device = herald.device_register(user="c-la", platform="apns", token=hex_token(1, prefix=0xA7))["device_id"]
        start = hex_token(2, prefix=0xA7)
        update = hex_token(3, prefix=0xA7)
        reg = herald.activity_register(user="c-la", device_id=device, push_to_start_token=start,
                                       activity_type="OrderAttributes")
        assert reg["created"] is True and reg["evicted"] == []
        sent = herald.push_send(
            to={"users": ["c-la"]}, kind="live_activity", event="start", activity_id="order-1",
            attributes_type="OrderAttributes", attributes={"shop": "Corner"}, content_state={"step": "packing"},
            alert={"loc_key": "ORDER_STARTED"}, wait=True, timeout_ms=20000)
        assert sent["counts"]["delivered"] == 1, sent
        (rec,) = gw.received("apns", token=start)
        assert rec["headers"]["apns-topic"] == TOPIC + ".push-type.liveactivity"
        assert rec["body"]["aps"]["event"] == "start"
        with herald.pipeline() as p:
            p.activity_register(user="c-la", device_id=device, update_token=update, activity_id="order-1")
            listed = p.activity_list(user="c-la")
        assert {a["role"] for a in listed.result()["activities"]} == {"push_to_start", "update"}
        upd = herald.push_send(to={"users": ["c-la"]}, kind="live_activity", event="update", activity_id="order-1",
                               content_state={"step": "on its way"}, stale_date="2030-01-01T00:00:00Z",
                               wait=True, timeout_ms=20000)
        assert upd["counts"]["delivered"] == 1, upd
        assert gw.received("apns", token=update)[-1]["body"]["aps"]["stale-date"] == 1893456000
        status = herald.push_status(message_id=upd["message_id"], detail=True)
        assert status["live_activity"]["event"] == "update" and status["live_activity"]["priority_lowered"] is False
        assert "content_state" not in status["live_activity"]
        assert herald.activity_unregister(user="c-la", device_id=device, activity_type="OrderAttributes")["removed"] == 1
        with pytest.raises(InvalidParams) as bad:
            herald.push_send(to={"users": ["c-la"]}, kind="live_activity", event="update", content_state={})
        assert bad.value.data["field"] == "activity_id"
        with pytest.raises(InvalidParams) as bad:
            herald.activity_register(user="c-la", device_id=device, update_token=update)
        assert bad.value.data["field"] == "activity_id"


def test_channels_through_the_client(gateways, gw):
    """channel_create against the management gateway, a start subscribed to the channel,
    push_broadcast as one request, channel_delete; on a daemon whose manage endpoints are the
    gateways'."""
    from herald_fixtures import Daemon

    ep = {"apns_manage_production": f"https://127.0.0.1:{gateways.ports['apns_manage']}",
          "apns_manage_development": f"https://127.0.0.1:{gateways.ports['apns_manage_dev']}"}
    d = Daemon(gateways=gateways, transports=("apns",), endpoints=ep)
    try:
        with Client(d.socket) as herald:
            ch = herald.channel_create(storage="none")
            assert herald.channel_list()["channels"] == [ch]
            sent = herald.push_broadcast(channel_id=ch["channel_id"], event="update", content_state={"n": 1},
                                         wait=True, timeout_ms=20000)
            assert sent["counts"]["delivered"] == 1, sent
            (rec,) = [r for r in gw.received("apns") if r.get("broadcast")]
            assert rec["channel_id"] == ch["channel_id"] and rec["headers"]["apns-expiration"] == "0"
            assert herald.channel_delete(channel_id=ch["channel_id"]) == {"removed": 1}
            with pytest.raises(InvalidParams) as bad:
                herald.push_broadcast(channel_id=ch["channel_id"], event="update", content_state={})
            assert bad.value.data["field"] == "channel_id"
    finally:
        d.cleanup()
