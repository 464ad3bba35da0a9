"""Access: who may open the socket, who may call which app, and what never lands on disk.

* The socket Herald creates has `[server] socket_mode` and the daemon's group: a peer whose uid
  and groups the mode does not admit cannot connect (EACCES); one in the socket's group can.
  Peers are forked children that drop to other uids/gids (the suite runs as root).
* `[app.NAME] allow_uids` / `allow_gids`: a peer outside them gets 1006 `forbidden` from every
  method that takes `app` (all of them), nothing is stored for it; `allow_gids` matches the
  primary gid and the supplementary groups (SO_PEERGROUPS). system.health, system.stats and
  system.metrics show a peer only the apps it may call (totals over those). A reload changes the
  lists without dropping the connection.
* `[server] max_connections_per_uid`: one connection more of a uid is answered 1007 `overloaded`
  and closed, while another uid still connects.
* Secrets (device tokens, Web Push endpoints and keys, sessions, provider key PEMs, the store
  key, APNs/VAPID/OAuth JWTs and FCM access tokens taken from what the gateways received) are
  absent from the daemon's log at debug level and from herald.db, -wal and -shm, checked as
  raw bytes, while running and after the stop, across successes, retries, stale deletions,
  credential refreshes, refused registrations, unregistrations and a reload.
* The store key is created 0600 (with a umask of 0, so the daemon must set the mode itself).
"""

from __future__ import annotations

import base64
import errno
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import pytest

from herald_fixtures import (CertAuthority, Daemon, Gateways, Keys, RPC, RecordingTLSProxy, as_peer, hex_token,
                             record_counts, reset_counts, unb64url, wait_until, web_keys)

SUITE = "access"
NOBODY = 65534
SOCK_GID = 4300        # the group the daemon runs with, so its socket belongs to it
APP_UID = 4242
APP_GID = 4343


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


def _connect_and_call(path):
    """In the child: connect, call system.health; the status or the errno."""
    def fn():
        try:
            with RPC(path, timeout=10) as c:
                return {"status": c.call("system.health")["status"]}
        except OSError as e:
            return {"errno": e.errno}
    return fn


def _peer(uid, gid, fn, groups=()):
    out = as_peer(uid, gid, fn, groups=groups)
    assert "ok" in out, out
    record_counts(SUITE, access_checks=1)
    return out["ok"]


# ----------------------------------------------------------------------------- the socket

@pytest.mark.parametrize("mode", ["0660", "0600", "0666"])
def test_socket_mode_and_group(mode):
    d = Daemon(transports=(), socket_mode=mode, dir_mode=0o755, run_gid=SOCK_GID)
    try:
        st = os.stat(d.socket)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == int(mode, 8), oct(st.st_mode)
        assert st.st_gid == SOCK_GID, "the socket belongs to the daemon's group"
        m = int(mode, 8)
        peers = [
            ("other uid, other group", NOBODY, NOBODY, (), bool(m & 0o002)),
            ("other uid, the socket's group as primary", NOBODY, SOCK_GID, (), bool(m & 0o020)),
            ("other uid, the socket's group as supplementary", NOBODY, NOBODY, (SOCK_GID,), bool(m & 0o020)),
            ("the owner (root)", 0, 0, (), True),
        ]
        for label, uid, gid, groups, allowed in peers:
            got = _peer(uid, gid, _connect_and_call(d.socket), groups=groups)
            if allowed:
                assert got == {"status": "ok"}, (mode, label, got)
            else:
                assert got == {"errno": errno.EACCES}, (mode, label, got)
        assert d.running
    finally:
        d.cleanup()


# ----------------------------------------------------------------------------- allow_uids / allow_gids

APPS = f"""
[app.uidlocked]
allow_uids = {APP_UID}

[app.gidlocked]
allow_gids = {APP_GID}

[app.both]
allow_uids = {APP_UID}
allow_gids = {APP_GID}
"""


def _method_calls(app, user):
    """One valid call of every method that takes `app` (all of them)."""
    return [
        ("device.register", {"user": user, "platform": "fcm", "token": f"{app}-{user}-token"}),
        ("device.unregister", {"user": user, "device_id": "0" * 32}),
        ("device.list", {"user": user}),
        ("device.update", {"user": user, "device_id": "0" * 32, "enabled": False}),
        ("session.end", {"user": user, "session": "s"}),
        ("activity.register", {"user": user, "device_id": "0" * 32, "update_token": "ab" * 16,
                               "activity_id": "a"}),
        ("activity.unregister", {"user": user, "activity_id": "a"}),
        ("activity.list", {"user": user}),
        ("channel.list", {}),
        ("channel.delete", {"channel_id": "AAAA"}),
        ("push.broadcast", {"channel_id": "AAAA", "event": "update", "content_state": {}}),
        ("channel.create", {"storage": "none"}),
        ("user.forget", {"user": user + "-other"}),
        ("push.send", {"to": {"users": [user]}}),
        ("push.status", {"message_id": "0" * 32}),
        ("push.cancel", {"message_id": "0" * 32}),
        ("system.health", {}),
        ("system.stats", {}),
        ("system.metrics", {}),
        ("vapid.public_key", {}),
        ("rpc.discover", {}),
        # Subscribed to a kind this fixture never writes, then unsubscribed: the calls after it
        # read no notification.
        ("events.subscribe", {"kinds": ["transport"]}),
        ("events.unsubscribe", {}),
    ]


def _call_all(path, app, user, bad_params=False):
    def fn():
        out = []
        with RPC(path, timeout=10) as c:
            for method, params in _method_calls(app, user):
                p = dict(params, app=app)
                if bad_params:
                    p["bogus"] = [1]
                r = c.request(method, p)
                err = r.get("error")
                out.append([method, err["code"] if err else None, (err or {}).get("data")])
            out.append(["health-after", c.call("system.health")["status"], None])
        return out
    return fn


@pytest.fixture(scope="module")
def locked():
    d = Daemon(transports=("web",), socket_mode="0666", dir_mode=0o755, apps=APPS)
    yield d
    d.cleanup()


def test_methods_list_is_complete():
    from herald_fixtures import REPO
    OPENRPC = json.loads((REPO / "docs" / "openrpc.json").read_text())
    assert {m for m, _ in _method_calls("a", "u")} == {m["name"] for m in OPENRPC["methods"]}


# (peer, uid, gid, supplementary groups, {app: allowed})
PEERS = [
    ("root", 0, 0, (), {"uidlocked": False, "gidlocked": False, "both": False, "default": True}),
    ("the allowed uid", APP_UID, NOBODY, (), {"uidlocked": True, "gidlocked": False, "both": True, "default": True}),
    ("the allowed gid (primary)", NOBODY, APP_GID, (), {"uidlocked": False, "gidlocked": True, "both": True,
                                                        "default": True}),
    ("the allowed gid as a supplementary group only", NOBODY, NOBODY, (APP_GID,),
     {"uidlocked": False, "gidlocked": True, "both": True, "default": True}),
    ("another uid and gid", 4999, 4999, (), {"uidlocked": False, "gidlocked": False, "both": False,
                                             "default": True}),
]


@pytest.mark.parametrize("label,uid,gid,groups,allowed", PEERS, ids=[p[0] for p in PEERS])
def test_allow_lists_for_every_method(locked, label, uid, gid, groups, allowed):
    user = f"acl-{uid}-{gid}-{len(groups)}"
    for app, ok in allowed.items():
        for bad in (False, True):
            results = _peer(uid, gid, _call_all(locked.socket, app, user, bad_params=bad), groups=groups)
            assert results[-1] == ["health-after", "ok", None], "the connection broke"
            for method, code, data in results[:-1]:
                if ok:
                    assert code != 1006, (label, app, method, code, data)
                    if bad:
                        assert code == -32602, (label, app, method, code, data)
                else:
                    assert code == 1006 and data == {"reason": "forbidden"}, (label, app, method, code, data)
    # Nothing was stored for a forbidden peer: an app it may not call holds no device of its
    # user (read as a peer every locked app admits); an app it may call holds the one it registered.
    assert len(locked.devices(user)) == 1
    for app in ("uidlocked", "gidlocked", "both"):
        listed = _peer(APP_UID, APP_GID, lambda app=app: RPC(locked.socket).call(
            "device.list", {"user": user, "app": app})["devices"])
        assert bool(listed) == allowed[app], (label, app, listed)
    # system.health without an app lists exactly the apps this peer may call.
    health = _peer(uid, gid, lambda: RPC(locked.socket).call("system.health"), groups=groups)
    assert set(health["transports"]) == {a for a, ok in allowed.items() if ok}, health
    # system.stats and system.metrics: the same apps (LimitsTests checks the totals over them).
    def figures():
        with RPC(locked.socket) as c:
            return {"stats": c.call("system.stats"), "metrics": c.call("system.metrics")["text"]}
    fig = _peer(uid, gid, figures, groups=groups)
    mine = {a for a, ok in allowed.items() if ok}
    assert set(fig["stats"].get("apps", allowed)) == mine and ("apps" in fig["stats"]) == (len(mine) < len(allowed))
    shown = set(re.findall(r'herald_transport_state\{app="([^"]+)"', fig["metrics"]))
    assert shown == mine, (label, shown)
    record_counts(SUITE, access_checks=len(allowed) * 2 * 15)


def test_a_subscriber_sees_only_the_events_of_its_apps(locked):
    """Events of an app the peer may not call never reach it, from `since` or live; a peer the
    app admits sees them."""
    def send_to_nobody(app):
        # A message to a user without devices: complete at once, one message_complete event.
        def fn():
            with RPC(locked.socket) as c:
                return c.call("push.send", {"app": app, "to": {"users": ["acl-events-nobody"]}})["message_id"]
        return fn

    locked_message = _peer(APP_UID, NOBODY, send_to_nobody("uidlocked"))
    open_message = _peer(0, 0, send_to_nobody("default"))

    def completions(app=None):
        def fn():
            seen = []
            with RPC(locked.socket, timeout=10) as c:
                params = {"since": "0", "kinds": ["message_complete"]}
                if app:
                    params["app"] = app
                r = c.request("events.subscribe", params)
                if "error" in r:
                    return {"error": r["error"]["code"]}
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    try:
                        msg = c.read_json(timeout=0.5)
                    except TimeoutError:
                        continue
                    seen += [(e["app"], e["message_id"]) for e in msg["params"]["events"]]
            return {"apps": r["result"]["apps"], "seen": seen}
        return fn

    as_root = _peer(0, 0, completions())
    assert "uidlocked" not in as_root["apps"] and "default" in as_root["apps"], as_root
    assert ("default", open_message) in [tuple(x) for x in as_root["seen"]], as_root
    assert all(app != "uidlocked" for app, _ in as_root["seen"]), as_root
    assert _peer(0, 0, completions("uidlocked")) == {"error": 1006}
    as_app = _peer(APP_UID, NOBODY, completions("uidlocked"))
    seen = [tuple(x) for x in as_app["seen"]]
    assert ("uidlocked", locked_message) in seen and all(app == "uidlocked" for app, _ in seen), as_app
    record_counts(SUITE, access_checks=4)


def test_reload_changes_the_allow_lists_without_dropping_the_connection(locked):
    text = Path(locked.config).read_text()
    user = "acl-reload"
    with locked.connect() as c:
        r = c.request("device.list", {"user": user, "app": "uidlocked"})
        assert r["error"]["code"] == 1006
        try:
            Path(locked.config).write_text(text.replace(f"allow_uids = {APP_UID}\n\n[app.gidlocked]",
                                                        f"allow_uids = {APP_UID}, 0\n\n[app.gidlocked]"))
            n = locked.log().count("config_reloaded")
            locked.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: locked.log().count("config_reloaded") > n, 10, what="config_reloaded")
            assert c.call("device.list", {"user": user, "app": "uidlocked"}) == {"devices": []}
            assert c.request("device.list", {"user": user, "app": "gidlocked"})["error"]["code"] == 1006
        finally:
            Path(locked.config).write_text(text)
            n = locked.log().count("config_reloaded")
            locked.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: locked.log().count("config_reloaded") > n, 10, what="config_reloaded")
        assert c.request("device.list", {"user": user, "app": "uidlocked"})["error"]["code"] == 1006
    record_counts(SUITE, access_checks=4)


# ----------------------------------------------------------------------------- secrets

def _pem_body_lines(pem: str):
    return [line for line in pem.splitlines() if line and not line.startswith("-----") and len(line) >= 16]


def _jwt_parts(jwt: str):
    parts = jwt.split(".")
    return [jwt] + [p for p in parts[1:] if len(p) >= 16]


def test_secrets_absent_from_logs_and_database(tmp_path):
    gw = Gateways.shared()
    gw.reset()
    keys = Keys.shared()
    # The OAuth token requests go through a recording proxy, so that the assertion JWT is known.
    ca = CertAuthority()
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(Path(gw.ca).read_bytes() + ca.pem())
    proxy = RecordingTLSProxy(*ca.leaf(ips=["127.0.0.1"], directory=str(tmp_path)), ("127.0.0.1", gw.ports["fcm"]),
                              gw.ca)
    token_uri = f"https://127.0.0.1:{proxy.port}/token"
    gw.knobs("fcm", token_aud=[token_uri])
    d = Daemon(gateways=gw, delivery={"max_retries": 3, "backoff_base_ms": 20, "backoff_max_ms": 50},
               token_uri=token_uri, endpoints={"ca_file": str(bundle)})
    try:
        subs = [gw.subscription() for _ in range(3)]
        apns_tokens = [hex_token(i, prefix=0x5EC) for i in range(3)]
        voip_token = hex_token(9, prefix=0x5ED)
        fcm_tokens = [f"fcm-secret-{os.urandom(6).hex()}" for _ in range(3)]
        sessions = [f"session-secret-{os.urandom(6).hex()}" for _ in range(2)]
        user = "secret-user"
        for i, t in enumerate(apns_tokens):
            d.register(user, "apns", t.upper() if i == 0 else t, session=sessions[0])
        d.register(user, "apns_voip", voip_token)
        for t in fcm_tokens:
            d.register(user, "fcm", t, session=sessions[1])
        for s in subs:
            d.register(user, "web", s["endpoint"], keys={"p256dh": s["p256dh"], "auth": s["auth"]})
        # Outcomes that take every path: stale (deleted), permanent, retried, credential refreshes.
        gw.program("apns", [{"status": 410, "reason": "Unregistered"}], token=apns_tokens[1])
        gw.program("apns", [{"status": 400, "reason": "BadDeviceToken"}], token=apns_tokens[2])
        gw.program("apns", [{"status": 403, "reason": "ExpiredProviderToken"}, {"status": 200}],
                   token=apns_tokens[0])
        gw.program("fcm", [{"error": "UNREGISTERED"}], token=fcm_tokens[1])
        gw.program("fcm", [{"error": "THIRD_PARTY_AUTH_ERROR"}, {"status": 200}], token=fcm_tokens[2])
        gw.program("webpush", [{"status": 410}], token=subs[1]["id"])
        gw.program("webpush", [{"status": 403}, {"status": 429, "retry_after": 0}, {"status": 201}],
                   token=subs[2]["id"])
        r = d.send_wait({"to": {"users": [user]}, "data": {"route": "r1"}, "collapse_key": "ck"})
        assert r["state"] == "complete", r
        d.send_wait({"to": {"users": [user]}, "kind": "call_ring"})
        # Refused calls that carry secrets.
        bad = web_keys()
        for params in (
            {"user": user, "platform": "web", "token": subs[0]["endpoint"], "keys": {"p256dh": bad["p256dh"][:-2],
                                                                                    "auth": bad["auth"]}},
            {"user": user, "platform": "apns", "token": apns_tokens[0] + "zz"},
            {"user": user, "platform": "fcm", "token": fcm_tokens[0], "keys": bad},
            {"user": user, "platform": "web", "token": subs[0]["endpoint"].replace("https", "http"), "keys": bad},
        ):
            assert "error" in d.request("device.register", params)
        d.call("device.unregister", {"user": user, "platform": "fcm", "token": fcm_tokens[0]})
        d.call("session.end", {"user": user, "session": sessions[0]})
        n = d.log().count("config_reloaded")
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: d.log().count("config_reloaded") > n, 10, what="config_reloaded")

        # What the providers saw: every credential Herald sent.
        jwts, access_tokens = set(), set()
        kinds = set()
        for rec in gw.received("apns"):
            for name, value in rec.get("header_list", []):
                if name == "authorization":
                    jwts.add(value.split(" ", 1)[1])
                    kinds.add("apns provider token")
        for rec in gw.received("webpush"):
            auth = rec["headers"].get("authorization", "")
            if auth.startswith("vapid"):
                jwts.add(auth.split("t=", 1)[1].split(",")[0].strip())
                kinds.add("vapid")
        for body in proxy.bodies:
            for part in body.decode().split("&"):
                if part.startswith("assertion="):
                    jwts.add(part.split("=", 1)[1])
                    kinds.add("oauth assertion")
        for rec in gw.received("fcm"):
            if rec.get("kind") == "token":
                if rec.get("access_token"):
                    access_tokens.add(rec["access_token"])
            else:
                auth = rec["headers"].get("authorization", "")
                if auth.lower().startswith("bearer "):
                    access_tokens.add(auth.split(" ", 1)[1])
        assert kinds == {"apns provider token", "vapid", "oauth assertion"}, kinds
        assert access_tokens and all(isinstance(t, str) and t.startswith("ya29.") for t in access_tokens)

        text_secrets = {}
        for t in apns_tokens + [voip_token]:
            text_secrets[f"apns token {t[:8]}"] = [t, t.upper()]
        for t in fcm_tokens:
            text_secrets[f"fcm token {t[:12]}"] = [t]
        for s in subs:
            text_secrets[f"endpoint {s['id'][:6]}"] = [s["endpoint"], s["id"], s["p256dh"], s["auth"]]
        for s in sessions:
            text_secrets[f"session {s[:16]}"] = [s]
        for i, j in enumerate(sorted(jwts)):
            text_secrets[f"jwt {i}"] = _jwt_parts(j)
        for i, t in enumerate(sorted(access_tokens)):
            text_secrets[f"access token {i}"] = [t]
        for name, pem in (("apns key", keys.apns_pem), ("vapid key", keys.vapid_pem), ("fcm key", keys.rsa_pem)):
            text_secrets[name] = _pem_body_lines(pem)
        store_key = Path(d.store_key).read_bytes()
        assert len(store_key) == 32
        binary_secrets = {"store key": [store_key, store_key.hex().encode(), base64.b64encode(store_key)]}
        for s in subs:
            binary_secrets[f"raw p256dh/auth {s['id'][:6]}"] = [unb64url(s["p256dh"]), unb64url(s["auth"])]
        raw_private = [keys.apns.private_numbers().private_value.to_bytes(32, "big"),
                       keys.vapid.private_numbers().private_value.to_bytes(32, "big")]
        binary_secrets["raw private scalars"] = raw_private

        def scan(where, blob: bytes):
            found = []
            for label, values in text_secrets.items():
                for v in values:
                    if v.encode() in blob:
                        found.append(f"{where}: {label} ({v[:10]}…)")
            for label, values in binary_secrets.items():
                for v in values:
                    if v in blob:
                        found.append(f"{where}: {label}")
            return found

        db_files = sorted(p for p in os.listdir(d.dir) if p.startswith("herald.db"))
        assert "herald.db" in db_files and "herald.db-wal" in db_files, db_files
        found = []
        for f in db_files:
            found += scan(f + " (running)", Path(d.dir, f).read_bytes())
        d.shutdown()
        log = Path(d.log_path).read_bytes()
        assert b"push_accepted" in log and b"device_removed_stale" in log and b"config_reloaded" in log
        found += scan("log", log)
        for marker in (b"eyJ", b"ya29.", b"earer ", b"vapid t=", b"BEGIN", b"PRIVATE KEY"):
            if marker in log:
                found.append(f"log: marker {marker!r}")
        for f in sorted(p for p in os.listdir(d.dir) if p.startswith("herald.db")):
            found += scan(f + " (stopped)", Path(d.dir, f).read_bytes())
        checked = sum(len(v) for v in text_secrets.values()) + sum(len(v) for v in binary_secrets.values())
        record_counts(SUITE, access_checks=checked)
        print(f"\nsecrets checked: {checked} values in the log and {len(db_files)} database files")
        assert not found, "\n".join(found)
    finally:
        d.cleanup()
        proxy.close()


# ----------------------------------------------------------------------------- the store key

@pytest.mark.parametrize("key", ["absolute", "bare name"])
def test_store_key_created_0600(key):
    d = Daemon(transports=(), umask=0, store_key=None if key == "absolute" else "store.key")
    try:
        st = os.lstat(d.store_key)
        assert stat.S_ISREG(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert st.st_size == 32 and st.st_uid == os.getuid()
        before = Path(d.store_key).read_bytes()
        d.register("sk", "fcm", "sk-token")
        d.shutdown()
        d.start()
        assert Path(d.store_key).read_bytes() == before, "the key was replaced at restart"
        assert stat.S_IMODE(os.lstat(d.store_key).st_mode) == 0o600
        assert len(d.devices("sk")) == 1
        record_counts(SUITE, access_checks=3)
    finally:
        d.cleanup()


# ----------------------------------------------------------------------------- connections per uid

def test_connections_per_uid_are_capped_per_uid():
    """`max_connections_per_uid = 4`: a fifth connection of uid APP_UID gets 1007 overloaded and
    EOF, while root (another uid) still connects; closing one gives the slot back."""
    d = Daemon(transports=(), socket_mode="0666", dir_mode=0o755, server={"max_connections_per_uid": 4})
    sync = Path(tempfile.mkdtemp(prefix="herald-rel-sync-"))
    os.chmod(sync, 0o777)    # the peer (another uid) leaves its marker here
    try:
        def five():
            held = [RPC(d.socket, timeout=10) for _ in range(4)]
            out = {"held": [c.call("system.health")["status"] for c in held]}
            with RPC(d.socket, timeout=10) as extra:
                r = extra.read_json(10)
                out["extra"] = r
                out["extra_eof"] = extra.eof(5)
            # Root's connections do not count against this uid, nor this uid's against root:
            # checked by the parent while these four are held (it waits for the marker file).
            (sync / "held").write_text("1")
            deadline = time.monotonic() + 30
            while not (sync / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            held[0].close()
            time.sleep(0.3)
            with RPC(d.socket, timeout=10) as again:
                out["after_close"] = again.call("system.health")["status"]
            for c in held[1:]:
                c.close()
            return out

        import threading
        result = {}
        t = threading.Thread(target=lambda: result.update(as_peer(APP_UID, APP_GID, five)))
        t.start()
        wait_until(lambda: (sync / "held").exists(), 30, what=f"the peer holding its four connections ({result})")
        with RPC(d.socket, timeout=10) as root:
            assert root.call("system.health")["status"] == "ok", "root was refused while uid 4242 was at its cap"
            stats = root.call("system.stats")
        (sync / "release").write_text("1")
        t.join(60)
        out = result.get("ok")
        assert out, result
        assert out["held"] == ["ok"] * 4
        e = out["extra"]["error"]
        assert e["code"] == 1007 and e["data"]["reason"] == "overloaded" and e["data"]["retry_after_ms"] > 0, e
        assert out["extra_eof"], "the refused connection stayed open"
        assert out["after_close"] == "ok", "no slot came back after a close"
        assert stats["connections"]["refused"] >= 1, stats
        assert d.running
        record_counts(SUITE, access_checks=5)
    finally:
        d.cleanup()
        shutil.rmtree(sync, ignore_errors=True)
