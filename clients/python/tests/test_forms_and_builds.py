"""herald_client's ``device_register`` with ``app_id`` and ``user_agent`` and the Web Push form on
other platforms, against a real daemon: two builds of one token are two devices, device.list
shows ``form``, ``app_id`` and ``user_agent``, ``device_unregister`` by values takes ``app_id``,
a Pipeline sends the new params, and a bad ``app_id`` is InvalidParams naming the field.
"""

from __future__ import annotations

import pytest

from herald_client import Client, InvalidParams
from herald_fixtures import web_keys


def test_two_builds_and_the_web_push_form(daemon, gw):
    with Client(daemon.socket) as herald:
        stable = herald.device_register(user="c-builds", platform="fcm", token="c-builds-tok")
        beta = herald.device_register(user="c-builds", platform="fcm", token="c-builds-tok", app_id="beta",
                                      user_agent="Chat/7 beta")
        assert beta["created"] and beta["device_id"] != stable["device_id"]
        keys = web_keys()
        sub = herald.device_register(user="c-builds", platform="unified_push",
                                     token="https://93.184.215.14/up/c-builds",
                                     keys={"p256dh": keys["p256dh"], "auth": keys["auth"]})
        listed = {d["device_id"]: d for d in herald.device_list(user="c-builds")["devices"]}
        assert listed[beta["device_id"]]["app_id"] == "beta"
        assert listed[beta["device_id"]]["user_agent"] == "Chat/7 beta"
        assert listed[stable["device_id"]]["app_id"] == "stable"
        assert listed[stable["device_id"]]["user_agent"] is None
        assert listed[stable["device_id"]]["form"] == "legacy"
        assert listed[sub["device_id"]]["form"] == "webpush"
        assert listed[sub["device_id"]]["platform"] == "unified_push"

        assert herald.device_unregister(user="c-builds", platform="fcm", token="c-builds-tok",
                                        app_id="beta")["removed"] == 1
        left = {d["device_id"] for d in herald.device_list(user="c-builds")["devices"]}
        assert left == {stable["device_id"], sub["device_id"]}

        with herald.pipeline() as p:
            again = p.device_register(user="c-builds", platform="fcm", token="c-builds-tok", app_id="beta",
                                      user_agent="Chat/8 beta")
        assert again.result()["device_id"] == beta["device_id"]

        with pytest.raises(InvalidParams) as e:
            herald.device_register(user="c-builds", platform="fcm", token="c-builds-tok", app_id="no good")
        assert e.value.data["field"] == "app_id"
