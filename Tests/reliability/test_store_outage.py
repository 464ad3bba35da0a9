"""A store that cannot be written (SPEC.md Revision 2, "Beyond one host": a database outage).

The outage is real: another process holds SQLite's write lock on ``herald.db`` (``BEGIN
EXCLUSIVE`` from this test), so every write Herald tries waits out its busy timeout and fails.
While it lasts:

  * ``device.register`` and ``push.send`` answer -32603 with ``data.reason`` ``store_unavailable``,
    never a silent accept, and the connection stays usable;
  * ``system.health`` reports ``store: degraded:<why>`` (its probe waits for the lock too);

and once the lock is let go, the store is ``ok`` again by itself, new calls are served, and
nothing accepted before the outage is lost. The daemon ends with exit 0 at SIGTERM.
"""

from __future__ import annotations

import os
import sqlite3

from herald_fixtures import Daemon, record_counts, reset_counts, wait_until

SUITE = "store_outage"
# The daemon's busy timeout is 5 s: a call waits that long, then fails.
CALL_TIMEOUT_S = 30


def _error(d: Daemon, method: str, params: dict) -> dict:
    resp = d.request(method, params, timeout=CALL_TIMEOUT_S)
    assert "error" in resp, f"{method} during the outage was answered {resp}"
    return resp["error"]


def test_store_outage_answers_store_unavailable_and_recovers():
    reset_counts(SUITE)
    d = Daemon(transports=("fcm",))
    try:
        before = [d.register("alice", "fcm", f"fcm-alice-{i}")["device_id"] for i in range(3)]
        sent = d.call("push.send", {"to": {"users": ["alice"]}})
        assert d.call("system.health")["store"] == "ok"

        # The daemon may be writing that message's results right now: wait for its write lock
        # (its own writes are short), then hold it.
        lock = sqlite3.connect(os.path.join(d.dir, "herald.db"), timeout=10, isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            for method, params in (
                    ("device.register", {"user": "bob", "platform": "fcm", "token": "fcm-bob"}),
                    ("push.send", {"to": {"users": ["alice"]}})):
                err = _error(d, method, params)
                assert err["code"] == -32603 and (err.get("data") or {}).get("reason") == "store_unavailable", \
                    f"{method}: {err}"
            health = wait_until(lambda: (h := d.call("system.health", timeout=CALL_TIMEOUT_S))["store"] != "ok"
                                and h, timeout=30, what="system.health to report the store degraded")
            assert health["store"].startswith("degraded:") and health["status"] == "degraded", health
        finally:
            if lock.in_transaction:
                lock.execute("ROLLBACK")
            lock.close()

        wait_until(lambda: d.call("system.health", timeout=CALL_TIMEOUT_S)["store"] == "ok", timeout=30,
                   what="the store to be ok again once the lock is gone")
        assert d.call("device.list", {"user": "bob"})["devices"] == [], "a refused registration was kept"
        bob = d.register("bob", "fcm", "fcm-bob")["device_id"]
        again = d.call("push.send", {"to": {"users": ["alice", "bob"]}})
        assert again["devices"] + again["skipped"] == 4, again
        # Nothing accepted before the outage is lost; nothing refused during it was kept.
        assert sorted(x["device_id"] for x in d.call("device.list", {"user": "alice"})["devices"]) == sorted(before)
        assert [x["device_id"] for x in d.call("device.list", {"user": "bob"})["devices"]] == [bob]
        assert d.status(sent["message_id"])["counts"], "the message accepted before the outage is still known"
        record_counts(SUITE, outage_calls_refused=2)
        d.shutdown()
    finally:
        d.cleanup()
