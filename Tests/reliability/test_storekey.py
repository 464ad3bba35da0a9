"""The store key against its database (SPEC.md Revision 2, "The store key").

One daemon with devices on every transport is stopped; then, on the same state directory:
  (a) store.key replaced with another 32-byte key: ``herald serve`` exits non-zero with one
      priority-3 line naming the key file and the database, never READY=1 (a NOTIFY_SOCKET the
      test listens on), and leaves the key file as it found it;
  (b) store.key deleted: the same, and no key file (nor a temporary one) is created;
  (c) the right key back: it starts and delivers to every device (judged by what the gateways
      received);
  (d) one device row damaged on disk (its sealed token zeroed): that delivery alone ends
      ``failed`` / ``unreadable_row``, every other device is delivered in the same message, and
      the next message is delivered too (the lane never stalls, push.send never answers -32603).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import tempfile

import pytest

from herald_fixtures import (Daemon, Gateways, HERALD_BIN, hex_token, record_counts, reset_counts)

SUITE = "storekey"
USERS = ("key-a", "key-b", "key-c")


@pytest.fixture(scope="module", autouse=True)
def _suite_counts():
    reset_counts(SUITE)
    yield


@pytest.fixture(scope="module")
def gw():
    return Gateways.shared()


def _serve_expecting_failure(d: Daemon, timeout=30.0):
    """Runs ``herald serve`` on the daemon's config with a NOTIFY_SOCKET of ours, to its exit.
    Returns (exit status, output, notifications); a daemon still up after ``timeout`` is killed
    and reported as status None."""
    notify_path = os.path.join(tempfile.mkdtemp(prefix="herald-rel-n-"), "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LISTEN_FDS", "LISTEN_PID", "WATCHDOG_USEC", "WATCHDOG_PID", "CREDENTIALS_DIRECTORY",
                        "HERALD_CONFIG", "HERALD_SOCKET")}
    env["NOTIFY_SOCKET"] = notify_path
    proc = subprocess.Popen([HERALD_BIN, "serve", "--config", d.config], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        status = None
    notes = []
    notify.setblocking(False)
    while True:
        try:
            notes.append(notify.recv(4096).decode(errors="replace"))
        except BlockingIOError:
            break
    notify.close()
    os.unlink(notify_path)
    os.rmdir(os.path.dirname(notify_path))
    return status, out.decode(errors="replace"), notes


def _check_refused(d: Daemon, what: str, key_bytes: bytes):
    status, out, notes = _serve_expecting_failure(d)
    assert status is not None, f"herald kept running with {what}:\n{out}"
    assert status != 0, f"exit 0 with {what}:\n{out}"
    assert not any("READY=1" in n for n in notes), notes
    errors = [line for line in out.splitlines() if line.startswith("<3>")]
    assert len(errors) == 1, f"one error line expected:\n{out}"
    line = errors[0]
    assert line.startswith("<3>startup_failed "), line
    assert d.store_key in line and os.path.join(d.dir, "herald.db") in line, line
    assert "herald_started" not in out
    assert key_bytes.hex() not in out, "no key material in the log"
    record_counts(SUITE, refused_starts=1)
    return line


def _stop(d: Daemon):
    d.shutdown()   # SIGTERM: exit 0 within the shutdown budget (DaemonExitFailure otherwise)


def _send_all(d: Daemon, users=USERS):
    r = d.send_wait({"to": {"users": list(users)}, "data": {"k": "v"}}, timeout_ms=30000)
    assert r["state"] == "complete", r
    return r


def _apns_token(user: str) -> str:
    return hex_token(sum(map(ord, user)), prefix=0x5E)


def test_wrong_or_missing_key_refused_and_right_key_delivers(gw):
    gw.reset()
    d = Daemon(gateways=gw)
    try:
        subs = {}
        devices = {}
        for user in USERS:
            subs[user] = gw.subscription()
            devices[(user, "apns")] = d.register(user, "apns", _apns_token(user))["device_id"]
            devices[(user, "fcm")] = d.register(user, "fcm", f"storekey-fcm-{user}")["device_id"]
            devices[(user, "web")] = d.register(
                user, "web", subs[user]["endpoint"],
                keys={"p256dh": subs[user]["p256dh"], "auth": subs[user]["auth"]})["device_id"]
        _stop(d)
        with open(d.store_key, "rb") as f:
            original = f.read()
        assert len(original) == 32

        # (a) another 32-byte key
        other = os.urandom(32)
        with open(d.store_key, "wb") as f:
            f.write(other)
        os.chmod(d.store_key, 0o600)
        line = _check_refused(d, "another key", other)
        assert "does not open the database" in line, line
        with open(d.store_key, "rb") as f:
            assert f.read() == other, "the key file is left as it was"

        # (b) no key at all: refused, and no key is made
        os.unlink(d.store_key)
        line = _check_refused(d, "no key file", original)
        assert "is missing but the database" in line and "9 devices" in line, line
        assert not [n for n in os.listdir(d.dir) if n.startswith("store.key")], os.listdir(d.dir)

        # (c) the right key: starts, delivers to all nine devices
        with open(d.store_key, "wb") as f:
            f.write(original)
        os.chmod(d.store_key, 0o600)
        d.start()
        r = _send_all(d)
        assert r["counts"].get("delivered") == 9, r
        for user in USERS:
            assert [x for x in gw.received("apns") if x.get("token") == _apns_token(user)], user
            assert [x for x in gw.received("fcm", kind="send") if x.get("token") == f"storekey-fcm-{user}"], user
            assert [x for x in gw.received("webpush") if x.get("token") == subs[user]["id"]], user
        _stop(d)

        # (d) one damaged row: that delivery alone fails; the lane goes on
        bad = devices[("key-b", "fcm")]
        db = sqlite3.connect(os.path.join(d.dir, "herald.db"))
        with db:
            n = db.execute("UPDATE devices SET token_sealed = zeroblob(length(token_sealed)) WHERE device_id = ?",
                           (bad,)).rowcount
        db.close()
        assert n == 1
        d.start()
        gw.reset()
        for round_ in (1, 2):
            r = _send_all(d)
            assert r["counts"].get("delivered") == 8 and r["counts"].get("failed") == 1, (round_, r)
            detail = d.status(r["message_id"])
            failed = [x for x in detail["devices"] if x["state"] == "failed"]
            assert [(x["device_id"], x.get("reason")) for x in failed] == [(bad, "unreadable_row")], detail
            fcm_tokens = [x.get("token") for x in gw.received("fcm", kind="send")]
            # At least once per message (a retry after a slow answer may add one).
            assert fcm_tokens.count("storekey-fcm-key-a") >= round_, fcm_tokens
            assert fcm_tokens.count("storekey-fcm-key-c") >= round_, fcm_tokens
            assert "storekey-fcm-key-b" not in fcm_tokens
        warnings = d.log_lines("device_row_unreadable", current_start_only=True)
        assert len(warnings) == 2 and all(w.startswith("<4>") and f"device={bad}" in w for w in warnings), warnings
        listed = {x["device_id"]: x for x in d.devices("key-b")}
        assert listed[bad]["last_failure_reason"] == "unreadable_row"
        record_counts(SUITE, unreadable_rows=1)
    finally:
        d.cleanup()


def test_new_state_directory_creates_the_key(gw):
    """No key and an empty database: the key is created 0600 (umask 0 cannot widen it)."""
    d = Daemon(gateways=gw, start=False, umask=0)
    try:
        d.start()
        st = os.stat(d.store_key)
        assert st.st_size == 32 and (st.st_mode & 0o777) == 0o600, oct(st.st_mode)
        assert d.log_lines("store_key_created"), d.log(20)
        _stop(d)
        d.start()
        assert len(d.log_lines("store_key_created")) == 1, "created once"
    finally:
        d.cleanup()
