"""Credential health through a real daemon, judged by the test gateways' records.

At start (and after each reload) Herald proves every app's credentials without sending to a
user: APNs with a silent push to a token no device has (the gateway, like Apple, checks the
provider token first: 403 InvalidProviderToken for a key it does not know, 400 BadDeviceToken for
a good one), FCM with a fresh OAuth exchange and a ``validate_only`` send (a revoked service
account key: 400 invalid_grant at the token endpoint), Web Push by the VAPID subject's form.

Before any push is sent: ``system.health`` shows the rejected credentials with the provider's
reason (and ``status: degraded``), the healthy ones ``ok`` with ``last_success_at``;
``herald_credential_ok`` is 0 and 1 accordingly; an app the caller may not use is not shown; a
``credential`` event per app and platform is in the store. The gateways recorded probes only (no
request to a device, no FCM send that was not a dry run). A reload that gives the rejected app a
key Apple knows turns it ``ok``.

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q -p no:cacheprovider \
        Tests/reliability/test_credential_health.py
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from herald_fixtures import KEY_ID, PROJECT_ID, TEAM_ID, TOPIC, Daemon, Gateways, metric, wait_until

REVOKED_EMAIL = "revoked@herald-test.iam.gserviceaccount.com"
UNKNOWN_KEY_ID = "UNKNOWN123"


def pem_private(key) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def pem_public(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture()
def gw():
    g = Gateways()   # its own: this test revokes and registers keys
    yield g
    g.stop()


def write_secret(path: str, text: str):
    Path(path).write_text(text)
    os.chmod(path, 0o600)


def credentials(d: Daemon) -> dict:
    return d.call("system.health")["credentials"]


def test_rejected_credentials_show_before_any_push(gw, tmp_path):
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir(mode=0o700)
    # An APNs key the gateway (Apple) does not know.
    unknown_apns = ec.generate_private_key(ec.SECP256R1())
    write_secret(str(keys_dir / "unknown.p8"), pem_private(unknown_apns))
    # An FCM service account whose key is revoked at the token endpoint.
    revoked_rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    gw.post("/control/fcm-key", {"client_email": REVOKED_EMAIL, "public_key_pem": pem_public(revoked_rsa),
                                 "project_id": PROJECT_ID})
    gw.post("/control/fcm-revoke", {"client_email": REVOKED_EMAIL, "key": True})
    account = {"type": "service_account", "project_id": PROJECT_ID, "private_key_id": "k2",
               "private_key": pem_private(revoked_rsa), "client_email": REVOKED_EMAIL,
               "token_uri": f"https://127.0.0.1:{gw.ports['fcm']}/token"}
    write_secret(str(keys_dir / "revoked.json"), json.dumps(account))

    bad_apns = (f"[app.badapns]\napns_key = {keys_dir}/unknown.p8\napns_key_id = {UNKNOWN_KEY_ID}\n"
                f"apns_team_id = {TEAM_ID}\napns_topic = {TOPIC}\n\n")
    bad_fcm = f"[app.badfcm]\nfcm_credentials = {keys_dir}/revoked.json\n\n"
    # Proven like the others, shown only to the peers it allows (uid 0; as root the test sees it,
    # and the check of what is hidden is skipped).
    hidden_uid = 0 if os.getuid() != 0 else 65534
    d = Daemon(gateways=gw, apps=bad_apns + bad_fcm, start=False)
    hidden = f"[app.hidden]\nallow_uids = {hidden_uid}\nfcm_credentials = {d.keys_dir}/fcm.json\n\n"
    Path(d.config).write_text(Path(d.config).read_text() + hidden)
    try:
        d.start()

        def settled():
            c = credentials(d)
            wanted = [("default", "apns"), ("default", "fcm"), ("default", "web"), ("badapns", "apns"),
                      ("badfcm", "fcm")]
            return all(c.get(app, {}).get(p, {}).get("status", "unknown") != "unknown" for app, p in wanted)

        wait_until(settled, timeout=15, what="the first verdicts of every credential")
        health = d.call("system.health")
        creds = health["credentials"]

        # Rejected, with the provider's reason; overall degraded.
        assert creds["badapns"]["apns"]["status"] == "rejected", creds["badapns"]
        assert creds["badapns"]["apns"]["reason"] == "InvalidProviderToken"
        assert creds["badapns"]["apns"]["last_success_at"] is None
        assert creds["badfcm"]["fcm"]["status"] == "rejected", creds["badfcm"]
        assert creds["badfcm"]["fcm"]["reason"] == "invalid_grant"
        assert health["status"] == "degraded"
        # A platform without credentials has no check.
        assert set(creds["badapns"]) == {"apns"} and set(creds["badfcm"]) == {"fcm"}
        # The healthy app: ok, with when it was last proven.
        for platform in ("apns", "fcm", "web"):
            entry = creds["default"][platform]
            assert entry["status"] == "ok", (platform, entry)
            assert entry["last_success_at"] and entry["last_success_at"].endswith("Z")
            assert entry["checked_at"] == entry["last_success_at"]
            assert "reason" not in entry
        # An app this peer may not call is not shown.
        if os.getuid() != 0:
            assert "hidden" not in creds and "hidden" not in health["transports"]

        m = d.metrics()
        assert metric(m, "herald_credential_ok", app="badapns", platform="apns") == 0
        assert metric(m, "herald_credential_ok", app="badfcm", platform="fcm") == 0
        for platform in ("apns", "fcm", "web"):
            assert metric(m, "herald_credential_ok", app="default", platform=platform) == 1
            assert metric(m, "herald_credential_last_success_seconds", app="default", platform=platform) > 1.7e9
        assert not m.samples("herald_credential_last_success_seconds", {"app": "badapns"})
        if os.getuid() != 0:
            assert not m.samples("herald_credential_ok", {"app": "hidden"})

        # What the providers saw: probes only.
        assert gw.received("apns") == [], "an APNs request reached a device"
        assert gw.received("apns_dev", probes="include") == []
        assert gw.received("fcm", kind="send") == [], "an FCM send was not a dry run"
        assert gw.received("webpush", probes="include") == []
        apns_probes = gw.received("apns", probes="only")
        assert apns_probes and {r["token"] for r in apns_probes} == {"0" * 64}
        assert {(r["response"]["status"], (r["response"].get("body") or {}).get("reason"))
                for r in apns_probes} == {(400, "BadDeviceToken"), (403, "InvalidProviderToken")}
        fcm_probes = gw.received("fcm", kind="send", probes="only")
        assert fcm_probes and all(r["validate_only"] and r["response"]["status"] == 200 for r in fcm_probes)
        assert any(r.get("key_revoked") for r in gw.received("fcm", kind="token"))

        # One credential event per app and platform, in the store.
        def events():
            with sqlite3.connect(f"file:{d.dir}/herald.db?mode=ro", uri=True) as db:
                return db.execute("SELECT app, platform, state, reason, detail FROM events "
                                  "WHERE kind = 'credential' ORDER BY cursor").fetchall()

        wait_until(lambda: len(events()) >= 5, timeout=5, what="the credential events")
        got = {(a, p): (s, r) for a, p, s, r, _ in events() if a != "hidden"}
        assert got[("badapns", "apns")] == ("rejected", "InvalidProviderToken")
        assert got[("badfcm", "fcm")] == ("rejected", "invalid_grant")
        assert got[("default", "apns")] == ("ok", None)
        assert set(json.loads(events()[0][4])) == {"checked_at", "last_success_at"}

        # A reload that gives badapns a key Apple knows: proven again, now ok.
        text = Path(d.config).read_text().replace(f"{keys_dir}/unknown.p8", f"{d.keys_dir}/apns.p8")
        Path(d.config).write_text(text.replace(f"apns_key_id = {UNKNOWN_KEY_ID}", f"apns_key_id = {KEY_ID}"))
        n = d.log().count("config_reloaded")
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: d.log().count("config_reloaded") > n, 10, what="config_reloaded")
        wait_until(lambda: credentials(d)["badapns"]["apns"]["status"] == "ok", timeout=10,
                   what="badapns proven after the reload")
        assert credentials(d)["badapns"]["apns"]["last_success_at"]
        assert credentials(d)["badfcm"]["fcm"]["status"] == "rejected"
        m = d.metrics()
        assert metric(m, "herald_credential_ok", app="badapns", platform="apns") == 1
        wait_until(lambda: ("badapns", "apns", "ok") in {(a, p, s) for a, p, s, _, _ in events()}, timeout=5,
                   what="the ok event after the reload")
        assert gw.received("apns") == [] and gw.received("fcm", kind="send") == []
    finally:
        d.cleanup()
