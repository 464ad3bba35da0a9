"""Interop checks of the `herald` CLI against Python reference implementations.

Web Push bodies are decrypted with `http_ece` (the reference aes128gcm
implementation used by pywebpush), VAPID JWTs are verified and keys are made
and read with `cryptography` (OpenSSL). `herald events` is run against a scripted
socket that sends the gaps of the event stream.

The binary is $HERALD_BIN, or <repo>/.build/debug/herald (run `swift build`).
Run:  .venv/bin/python -m pytest Tests/interop -q
"""

import base64
import json
import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import http_ece
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa, utils

REPO = Path(__file__).resolve().parents[2]
HERALD = Path(os.environ.get("HERALD_BIN") or REPO / ".build" / "debug" / "herald")

HEADER_BYTES = 86
OVERHEAD = 103  # header 86 + delimiter 1 + tag 16
DEFAULT_BODY = 2816
MAX_BODY = 4096


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def run(*args, stdin: bytes = b"", cwd=None) -> subprocess.CompletedProcess:
    if not HERALD.is_file() or not os.access(HERALD, os.X_OK):
        pytest.fail(f"herald binary not found at {HERALD}; run `swift build` or set HERALD_BIN")
    return subprocess.run(
        [str(HERALD), *map(str, args)], input=stdin, capture_output=True, cwd=cwd, timeout=60
    )


def assert_bad_input(proc: subprocess.CompletedProcess) -> None:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, (proc.returncode, err)
    assert proc.stdout == b"", proc.stdout
    assert err.startswith("herald: "), err
    assert err.endswith("\n") and "\n" not in err[:-1], f"not one line: {err!r}"


def public_point(key) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )


# --------------------------------------------------------------------------
# (a) webpush encrypt decrypts with http_ece


@pytest.fixture
def subscriber():
    ua_priv = ec.generate_private_key(ec.SECP256R1())
    auth = os.urandom(16)
    return ua_priv, auth, b64url(public_point(ua_priv)), b64url(auth)


def encrypt(subscriber, plaintext: bytes, pad=None) -> subprocess.CompletedProcess:
    _, _, p256dh, auth = subscriber
    args = ["webpush", "encrypt", "--p256dh", p256dh, "--auth", auth]
    if pad is not None:
        args += ["--pad", str(pad)]
    return run(*args, stdin=plaintext)


def decrypt(subscriber, body: bytes) -> bytes:
    ua_priv, auth, _, _ = subscriber
    return http_ece.decrypt(body, private_key=ua_priv, auth_secret=auth, version="aes128gcm")


@pytest.mark.parametrize("size", [0, 1, 100, 2713])
def test_webpush_default_pad_decrypts(subscriber, size):
    plaintext = os.urandom(size)
    proc = encrypt(subscriber, plaintext)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    body = proc.stdout
    assert len(body) == DEFAULT_BODY
    assert decrypt(subscriber, body) == plaintext


@pytest.mark.parametrize(
    "pad,size",
    [
        (0, 0),
        (0, 1),
        (0, 500),
        (0, 3993),
        (104, 0),
        (104, 1),
        (200, 97),
        (1000, 123),
        (2816, 2713),
        (4096, 0),
        (4096, 3993),
    ],
)
def test_webpush_pad_values_decrypt(subscriber, pad, size):
    plaintext = os.urandom(size)
    proc = encrypt(subscriber, plaintext, pad)
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout
    assert len(body) == (size + OVERHEAD if pad == 0 else pad)
    assert decrypt(subscriber, body) == plaintext


def test_webpush_header_fields(subscriber):
    body = encrypt(subscriber, b"hello").stdout
    salt, rs, idlen = body[:16], int.from_bytes(body[16:20], "big"), body[20]
    assert len(salt) == 16
    assert rs == 4096
    assert idlen == 65
    keyid = body[21:HEADER_BYTES]
    # The key id is the sender's ephemeral P-256 public key.
    ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), keyid)
    assert keyid != unb64url(subscriber[2])


def test_webpush_text_plaintext_roundtrip(subscriber):
    plaintext = json.dumps({"title": "Hi ✓", "body": "x" * 300}).encode()
    assert decrypt(subscriber, encrypt(subscriber, plaintext).stdout) == plaintext


def test_webpush_two_encryptions_differ(subscriber):
    plaintext = b"same message"
    a = encrypt(subscriber, plaintext).stdout
    b = encrypt(subscriber, plaintext).stdout
    assert a != b
    assert a[:16] != b[:16], "salt must be fresh"
    assert a[21:HEADER_BYTES] != b[21:HEADER_BYTES], "ephemeral key must be fresh"
    assert decrypt(subscriber, a) == decrypt(subscriber, b) == plaintext


def test_webpush_wrong_auth_does_not_decrypt(subscriber):
    ua_priv, auth, _, _ = subscriber
    body = encrypt(subscriber, b"secret").stdout
    with pytest.raises(Exception):
        http_ece.decrypt(body, private_key=ua_priv, auth_secret=bytes(16), version="aes128gcm")


@pytest.mark.parametrize("pad,size", [(None, 2714), (0, 3994), (4096, 3994), (200, 98)])
def test_webpush_too_large_is_refused(subscriber, pad, size):
    assert_bad_input(encrypt(subscriber, os.urandom(size), pad))


@pytest.mark.parametrize("pad", [5000, 4097, 50, -1])
def test_webpush_bad_pad_is_refused(subscriber, pad):
    assert_bad_input(encrypt(subscriber, b"", pad))


def test_webpush_off_curve_p256dh_is_refused(subscriber):
    point = bytearray(unb64url(subscriber[2]))
    point[-1] ^= 1
    with pytest.raises(ValueError):
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), bytes(point))
    proc = run("webpush", "encrypt", "--p256dh", b64url(bytes(point)), "--auth", subscriber[3],
               stdin=b"hi")
    assert_bad_input(proc)


@pytest.mark.parametrize("auth_len", [0, 15, 17, 32])
def test_webpush_bad_auth_length_is_refused(subscriber, auth_len):
    proc = run("webpush", "encrypt", "--p256dh", subscriber[2], "--auth",
               b64url(os.urandom(auth_len)), stdin=b"hi")
    assert_bad_input(proc)


# --------------------------------------------------------------------------
# (b) vapid token verifies with cryptography


@pytest.fixture
def vapid_key(tmp_path):
    path = tmp_path / "vapid.pem"
    proc = run("vapid", "generate", "--out", path)
    assert proc.returncode == 0, proc.stderr
    return path, proc.stdout.decode().strip()


def parse_authorization(line: str):
    assert line.startswith("vapid t="), line
    jwt, k = line[len("vapid t="):].split(", k=")
    header, claims, signature = jwt.split(".")
    return header, claims, signature, k


def verify_jwt(header: str, claims: str, signature: str, k: str) -> None:
    sig = unb64url(signature)
    assert len(sig) == 64
    der = utils.encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    pub = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(k))
    pub.verify(der, f"{header}.{claims}".encode("ascii"), ec.ECDSA(hashes.SHA256()))


def test_vapid_token_verifies(vapid_key):
    path, public_key = vapid_key
    before = int(time.time())
    proc = run("vapid", "token", "--key", path, "--aud", "https://fcm.googleapis.com/fcm/send/abc",
               "--sub", "mailto:ops@example.com")
    after = int(time.time())
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.decode()
    assert line.endswith("\n") and "\n" not in line[:-1]
    header, claims, signature, k = parse_authorization(line.strip())

    assert unb64url(header) == b'{"typ":"JWT","alg":"ES256"}'
    body = json.loads(unb64url(claims))
    assert body["aud"] == "https://fcm.googleapis.com"
    assert body["sub"] == "mailto:ops@example.com"
    assert before + 43200 <= body["exp"] <= after + 43200
    assert k == public_key

    verify_jwt(header, claims, signature, k)
    # And a changed payload does not verify.
    forged = b64url(json.dumps({**body, "aud": "https://evil.example"}, separators=(",", ":")).encode())
    with pytest.raises(InvalidSignature):
        verify_jwt(header, forged, signature, k)


def test_vapid_token_with_cryptography_key_verifies(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "k.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    proc = run("vapid", "token", "--key", path, "--aud", "https://h.example:8443/x",
               "--sub", "https://example.com/contact", "--exp", "60")
    assert proc.returncode == 0, proc.stderr
    header, claims, signature, k = parse_authorization(proc.stdout.decode().strip())
    assert unb64url(k) == public_point(key)
    body = json.loads(unb64url(claims))
    assert body["aud"] == "https://h.example:8443"
    assert abs(body["exp"] - (int(time.time()) + 60)) <= 5
    verify_jwt(header, claims, signature, k)


# --------------------------------------------------------------------------
# (c) vapid generate --out loads with cryptography


def test_vapid_generate_pem_loads(vapid_key):
    path, public_key = vapid_key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert b64url(public_point(key)) == public_key
    assert len(unb64url(public_key)) == 65


def test_vapid_generate_stdout_pem_loads():
    proc = run("vapid", "generate")
    assert proc.returncode == 0, proc.stderr
    key = serialization.load_pem_private_key(proc.stdout, password=None)
    assert b64url(public_point(key)) in proc.stderr.decode()


def test_vapid_generate_refuses_overwrite(tmp_path):
    path = tmp_path / "exists.pem"
    path.write_text("keep me\n")
    assert_bad_input(run("vapid", "generate", "--out", path))
    assert path.read_text() == "keep me\n"


# --------------------------------------------------------------------------
# (d) key files made by cryptography give the same public key


def key_files(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    sec1 = key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())
    assert b"BEGIN EC PRIVATE KEY" in sec1
    raw = b64url(key.private_numbers().private_value.to_bytes(32, "big")).encode() + b"\n"
    files = {}
    for name, data in {"pkcs8.pem": pkcs8, "sec1.pem": sec1, "raw.key": raw}.items():
        p = tmp_path / name
        p.write_bytes(data)
        files[name] = p
    return key, files


@pytest.mark.parametrize("name", ["pkcs8.pem", "sec1.pem", "raw.key"])
def test_public_key_matches_cryptography(tmp_path, name):
    key, files = key_files(tmp_path)
    proc = run("vapid", "public-key", "--key", files[name])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == b64url(public_point(key)) + "\n"


@pytest.mark.parametrize("name", ["pkcs8.pem", "sec1.pem", "raw.key"])
def test_verify_matches_cryptography(tmp_path, name):
    key, files = key_files(tmp_path)
    other = ec.generate_private_key(ec.SECP256R1())
    ok = run("vapid", "verify", "--key", files[name], "--public-key", b64url(public_point(key)))
    assert ok.returncode == 0, ok.stderr
    mismatch = run("vapid", "verify", "--key", files[name], "--public-key",
                   b64url(public_point(other)))
    assert mismatch.returncode == 1, mismatch.stderr


# --------------------------------------------------------------------------
# (e) keys of other types are refused


def _pem(key, fmt=serialization.PrivateFormat.PKCS8) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


@pytest.mark.parametrize(
    "name,make",
    [
        ("p384-pkcs8.pem", lambda: _pem(ec.generate_private_key(ec.SECP384R1()))),
        ("p384-sec1.pem", lambda: _pem(ec.generate_private_key(ec.SECP384R1()),
                                       serialization.PrivateFormat.TraditionalOpenSSL)),
        ("secp256k1.pem", lambda: _pem(ec.generate_private_key(ec.SECP256K1()))),
        ("rsa-pkcs8.pem", lambda: _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))),
        ("rsa-pkcs1.pem", lambda: _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048),
                                       serialization.PrivateFormat.TraditionalOpenSSL)),
    ],
)
@pytest.mark.parametrize("command", ["public-key", "token"])
def test_other_key_types_refused(tmp_path, name, make, command):
    path = tmp_path / name
    path.write_bytes(make())
    args = ["vapid", command, "--key", path]
    if command == "token":
        args += ["--aud", "https://push.example.net", "--sub", "mailto:ops@example.com"]
    assert_bad_input(run(*args))


def test_encrypted_pem_refused(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "enc.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"pw")))
    assert_bad_input(run("vapid", "public-key", "--key", path))


# --------------------------------------------------------------------------
# (f) herald events against a scripted socket: the gaps of the event stream


class ScriptedDaemon:
    """A Unix socket that answers each connection's events.subscribe (recorded) and sends the
    next lines of ``script``, keeping the connection open."""

    def __init__(self, path, script):
        self.script, self.subscriptions, self.open = list(script), [], []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(4)
        threading.Thread(target=self.serve, daemon=True).start()

    def close(self):
        self.listener.close()
        for c in self.open:
            c.close()

    def serve(self):
        while self.script:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            line = b""
            while not line.endswith(b"\n"):
                line += conn.recv(4096)
            request = json.loads(line)
            self.subscriptions.append(request["params"])
            answer = {"jsonrpc": "2.0", "id": request["id"],
                      "result": {"cursor": request["params"].get("since"), "apps": ["default"], "kinds": []}}
            conn.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in [answer, *self.script.pop(0)]))
            self.open.append(conn)


def event_line(*cursors_or_events):
    events = [{"cursor": str(c), "kind": "delivery", "at": "2026-12-07T10:00:00.000Z", "app": "default"}
              if isinstance(c, int) else c for c in cursors_or_events]
    return {"jsonrpc": "2.0", "method": "events", "params": {"cursor": events[-1]["cursor"], "events": events}}


def test_events_reads_again_from_a_slow_gap_and_prints_a_retention_gap(tmp_path):
    path = tmp_path / "s.sock"
    retention = {"kind": "gap", "cursor": "4", "reason": "retention"}
    fake = ScriptedDaemon(path, [
        # From "0": events up to 4 were purged; 5 and 6; the daemon skips 7 and 8 (slow), 9 live.
        [event_line(retention), event_line(5, 6), event_line({"kind": "gap", "cursor": "6", "reason": "slow"}),
         event_line(9)],
        # The replay from 6.
        [event_line(7, 8, 9), event_line(10)],
    ])
    try:
        proc = run("events", "--kinds", "delivery", "--socket", path)
    finally:
        fake.close()
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert lines[0] == retention
    assert [e["cursor"] for e in lines[1:]] == ["5", "6", "7", "8", "9", "10"]
    assert all(e["kind"] == "delivery" for e in lines[1:])
    assert "fell behind" in proc.stderr.decode() and "from 6" in proc.stderr.decode()
    assert fake.subscriptions == [{"kinds": ["delivery"], "since": "0"}, {"kinds": ["delivery"], "since": "6"}]
