"""herald_client with device.register's ``bundle_id`` and ``application_server_key`` and
push.send's presentation params, against a real daemon and the provider test gateways
(conftest.py): what each param does reaches the provider, device.list shows ``bundle_id``,
system.stats ``web_subscriptions_by_key``, and a param on the wrong platform is InvalidParams
naming it.
"""

from __future__ import annotations

import pytest

from herald_client import Client, InvalidParams
from herald_fixtures import TOPIC, Keys, hex_token


def test_bundle_id_and_application_server_key_on_one_users_devices(daemon, gw):
    vapid = Keys.shared().vapid_public
    with Client(daemon.socket) as herald:
        apns = herald.device_register(
            user="c-bk", platform="apns", token=hex_token(1, prefix=0xB1), bundle_id=TOPIC
        )
        sub = gw.subscription(vapid_public_key=vapid)
        web = herald.device_register(
            user="c-bk", platform="web", token=sub["endpoint"], keys=gw.web_keys(sub), application_server_key=vapid
        )
        listed = {d["device_id"]: d for d in herald.device_list(user="c-bk")["devices"]}
        assert listed[apns["device_id"]]["bundle_id"] == TOPIC
        assert listed[web["device_id"]]["bundle_id"] is None
        assert herald.system_stats()["web_subscriptions_by_key"]["default"].get(vapid, 0) >= 1

        sent = herald.push_send(
            to={"users": ["c-bk"]},
            interruption_level="time-sensitive",
            relevance_score=0.5,
            thread_id="conv-1",
            category="MSG",
            android_channel_id="urgent",
            wait=True,
            timeout_ms=20000,
        )
        assert sent["counts"]["delivered"] == 2, sent
        (record,) = gw.received("apns", token=hex_token(1, prefix=0xB1))
        assert record["headers"]["apns-topic"] == TOPIC
        aps = record["body"]["aps"]
        assert aps["interruption-level"] == "time-sensitive" and aps["relevance-score"] == 0.5
        assert aps["thread-id"] == "conv-1" and aps["category"] == "MSG"
        (pushed,) = gw.received("webpush", token=sub["id"])
        assert pushed["valid"] is True and pushed["vapid"]["k"] == vapid


def test_each_param_on_the_wrong_platform_is_invalid_params_naming_it(daemon):
    vapid = Keys.shared().vapid_public
    with Client(daemon.socket) as herald:
        with pytest.raises(InvalidParams) as bundle:
            herald.device_register(user="c-bad", platform="fcm", token="c-bad-1", bundle_id=TOPIC)
        assert bundle.value.field == "bundle_id"
        with pytest.raises(InvalidParams) as key:
            herald.device_register(
                user="c-bad", platform="apns", token=hex_token(2, prefix=0xB1), application_server_key=vapid
            )
        assert key.value.field == "application_server_key"
        with pytest.raises(InvalidParams) as level:
            herald.push_send(to={"users": ["c-bad"]}, kind="clear", interruption_level="passive")
        assert level.value.field == "interruption_level"
        assert herald.device_list(user="c-bad")["devices"] == []


def test_the_new_params_in_a_pipeline(daemon):
    with Client(daemon.socket) as herald:
        with herald.pipeline() as p:
            registered = p.device_register(
                user="c-bkp", platform="apns", token=hex_token(3, prefix=0xB1), bundle_id=TOPIC
            )
            refused = p.device_register(user="c-bkp", platform="fcm", token="c-bkp-1", bundle_id=TOPIC)
            sent = p.push_send(to={"users": ["c-bkp"]}, thread_id="t-1", relevance_score=1)
        assert registered.result()["created"] is True
        assert isinstance(refused.exception(), InvalidParams)
        assert sent.result()["devices"] == 1
