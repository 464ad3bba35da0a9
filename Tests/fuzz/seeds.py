#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into Tests/fuzz/corpus/<target>/.

Run it only to rebuild the seeds from scratch (`python3 Tests/fuzz/seeds.py`):
the keys are generated anew with the openssl command-line tool, so every run
gives other bytes. The committed corpus is these seeds plus the units that
`make fuzz-merge` chose to keep. Genuine secretboxes are sealed with libsodium
(ctypes) under the fixed key of Tests/fuzz/c/secretbox.c. Every key here is a
throwaway made for the corpus and is used for nothing else.
"""

import base64
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# P-256 group order and field prime.
ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
PRIME = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF

# RFC 8291 Appendix A.
RFC8291_UA_PRIVATE = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"
RFC8291_UA_PUBLIC = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
RFC8291_AS_PRIVATE = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"
RFC8291_AUTH = "BTBZMqHH6r4Tts7J_aSIgg"
RFC8291_SALT = "DGv6ra1nlYgDCS1FRnbzlw"
RFC8291_PLAINTEXT = b"When I grow up, I want to be a watermelon"

SECRETBOX_KEY = b"herald fuzz secretbox key 32 by\0"


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def openssl(*args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(("openssl",) + args, input=stdin, check=True, capture_output=True).stdout


class Keys:
    """Throwaway keys in every form the targets read."""

    def __init__(self, tmp: str):
        self.tmp = tmp
        self.ec_pkcs8 = openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
        self.ec_sec1 = openssl("ec", stdin=self.ec_pkcs8)
        self.ec_public = openssl("pkey", "-pubout", stdin=self.ec_pkcs8)
        text = openssl("pkey", "-text", "-noout", stdin=self.ec_pkcs8).decode()
        priv_hex = "".join(text.split("priv:")[1].split("pub:")[0].split()).replace(":", "")
        self.ec_raw = int(priv_hex, 16).to_bytes(32, "big")
        pub_hex = "".join(text.split("pub:")[1].split("ASN1 OID")[0].split()).replace(":", "")
        self.ec_point = bytes.fromhex(pub_hex)
        self.ec_pkcs8_encrypted = openssl(
            "pkcs8", "-topk8", "-v2", "aes-128-cbc", "-iter", "1", "-passout", "pass:x",
            stdin=self.ec_pkcs8)
        self.ec_legacy_encrypted = openssl("ec", "-aes128", "-passout", "pass:x", stdin=self.ec_pkcs8)
        self.rsa_pkcs8 = openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
        self.rsa_pkcs1 = openssl("rsa", "-traditional", stdin=self.rsa_pkcs8)
        self.rsa_public = openssl("pkey", "-pubout", stdin=self.rsa_pkcs8)
        self.rsa_1024 = openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024")
        self.p384 = openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384")
        self.ed25519 = openssl("genpkey", "-algorithm", "ED25519")
        key_path = os.path.join(tmp, "ec.pem")
        with open(key_path, "wb") as f:
            f.write(self.ec_pkcs8)
        self.certificate = openssl("req", "-new", "-x509", "-key", key_path, "-subj", "/CN=herald fuzz",
                                   "-days", "1")

    def es256(self, message: bytes) -> bytes:
        """A raw r || s ES256 signature by the P-256 key."""
        key_path = os.path.join(self.tmp, "ec.pem")
        der = openssl("dgst", "-sha256", "-sign", key_path, stdin=message)
        assert der[0] == 0x30
        i = 2
        parts = []
        for _ in range(2):
            assert der[i] == 0x02
            n = der[i + 1]
            parts.append(int.from_bytes(der[i + 2 : i + 2 + n], "big"))
            i += 2 + n
        return b"".join(p.to_bytes(32, "big") for p in parts)


def secretbox(ad: bytes, plaintext: bytes, nonce: bytes) -> bytes:
    sodium = ctypes.CDLL("libsodium.so.23")
    assert sodium.sodium_init() >= 0
    out = ctypes.create_string_buffer(len(plaintext) + 16)
    out_len = ctypes.c_ulonglong(0)
    assert sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
        out, ctypes.byref(out_len), plaintext, ctypes.c_ulonglong(len(plaintext)), ad,
        ctypes.c_ulonglong(len(ad)), None, nonce, SECRETBOX_KEY) == 0
    return b"\x01" + nonce + out.raw[: out_len.value]


def service_account(private_key: str, **changes) -> bytes:
    account = {
        "type": "service_account",
        "project_id": "herald-fuzz",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": private_key,
        "client_email": "herald@herald-fuzz.iam.gserviceaccount.com",
        "client_id": "123456789012345678901",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": "https://oauth2.googleapis.com/token",
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/herald",
        "universe_domain": "googleapis.com",
    }
    for name, value in changes.items():
        if value is None:
            account.pop(name, None)
        else:
            account[name] = value
    return json.dumps(account, indent=2).encode() + b"\n"


def seeds(keys: Keys) -> dict[str, dict[str, bytes]]:
    ec_raw_b64 = b64u(keys.ec_raw).encode()
    corpus: dict[str, dict[str, bytes]] = {}

    corpus["base64url"] = {
        "empty": b"",
        "a": b"YQ",
        "a-padded": b"YQ==",
        "ab-padded": b"YWI=",
        "abc": b"YWJj",
        "url-safe": b"-_8",
        "raw-key": ec_raw_b64,
        "p256dh": b64u(keys.ec_point).encode(),
        "auth": RFC8291_AUTH.encode(),
        "trailing-bits": b"YR",
        "one-mod-four": b"YWJjZ",
        "standard-alphabet": b"YW+/",
        "bad-padding": b"YWJj=",
        "inner-padding": b"YQ==YQ==",
        "space": b"YW Jj",
        "binary": bytes(range(256)),
        # Found by this target: libsodium 1.0.18 read bytes >= 0x80 as '_'.
        "regress-high-bytes": b"YW\xc3\xa9",
        "regress-high-bytes-long": b"BTBZM" + b"\xff" * 20 + b"qHH6r4Tts7J_aSIgg",
    }

    order_minus_1 = (ORDER - 1).to_bytes(32, "big")
    corpus["p256_key"] = {
        "raw-32": keys.ec_raw,
        "raw-b64url": ec_raw_b64,
        "raw-b64url-whitespace": b"\n\t " + ec_raw_b64 + b" \r\n",
        "raw-b64url-padded": base64.urlsafe_b64encode(keys.ec_raw),
        "raw-zero": b64u(bytes(32)).encode(),
        "raw-order": b64u(ORDER.to_bytes(32, "big")).encode(),
        "raw-order-minus-1": b64u(order_minus_1).encode(),
        "raw-one": b64u((1).to_bytes(32, "big")).encode(),
        "raw-33": b64u(b"\x00" + keys.ec_raw).encode(),
        "pkcs8.pem": keys.ec_pkcs8,
        "sec1.pem": keys.ec_sec1,
        "pkcs8-whitespace.pem": b"\r\n  " + keys.ec_pkcs8 + b"\n\n",
        "p384.pem": keys.p384,
        "ed25519.pem": keys.ed25519,
        "rsa.pem": keys.rsa_pkcs8,
        "regress-high-bytes": ec_raw_b64[:40] + b"\xc3\xa9\xc3",
    }

    message = b"herald fuzz message"
    signature = keys.es256(message)
    x_is_p = b"\x04" + PRIME.to_bytes(32, "big") + keys.ec_point[33:]
    corpus["p256_public"] = {
        "point": keys.ec_point,
        "point-auth": keys.ec_point + unb64u(RFC8291_AUTH),
        "point-signature": keys.ec_point + signature + message,
        "rfc8291-ua": unb64u(RFC8291_UA_PUBLIC) + unb64u(RFC8291_AUTH),
        "compressed": bytes([0x02 + (keys.ec_point[64] & 1)]) + keys.ec_point[1:33],
        "prefix-06": b"\x06" + keys.ec_point[1:],
        "x-is-p": x_is_p,
        "y-plus-one": keys.ec_point[:64] + bytes([(keys.ec_point[64] + 1) & 0xFF]),
        "zero-point": b"\x04" + bytes(64),
        "infinity": b"\x00",
        "64-bytes": keys.ec_point[1:],
    }

    corpus["pem"] = {
        "ec-pkcs8.pem": keys.ec_pkcs8,
        "ec-sec1.pem": keys.ec_sec1,
        "ec-public.pem": keys.ec_public,
        "ec-pkcs8-encrypted.pem": keys.ec_pkcs8_encrypted,
        "ec-legacy-encrypted.pem": keys.ec_legacy_encrypted,
        "rsa-pkcs8.pem": keys.rsa_pkcs8,
        "rsa-pkcs1.pem": keys.rsa_pkcs1,
        "rsa-public.pem": keys.rsa_public,
        "rsa-1024.pem": keys.rsa_1024,
        "p384.pem": keys.p384,
        "ed25519.pem": keys.ed25519,
        "certificate-and-key.pem": keys.certificate + keys.ec_pkcs8,
        "text-around.pem": b"Herald VAPID key\n" + keys.ec_pkcs8 + b"trailing text\n",
        "truncated.pem": keys.ec_pkcs8[: len(keys.ec_pkcs8) // 2],
    }

    rsa = keys.rsa_pkcs8.decode()
    corpus["fcm_account"] = {
        "account.json": service_account(rsa),
        "account-pkcs1.json": service_account(keys.rsa_pkcs1.decode()),
        "minimal.json": json.dumps({
            "project_id": "p", "client_email": "a@b", "token_uri": "https://t", "private_key": rsa,
        }).encode(),
        "missing-token-uri.json": service_account(rsa, token_uri=None),
        "empty-project-id.json": service_account(rsa, project_id=""),
        "http-token-uri.json": service_account(rsa, token_uri="http://oauth2.googleapis.com/token"),
        "email-without-at.json": service_account(rsa, client_email="herald.example"),
        "email-with-space.json": service_account(rsa, client_email="herald @example.com"),
        "p256-key.json": service_account(keys.ec_pkcs8.decode()),
        "rsa-1024.json": service_account(keys.rsa_1024.decode()),
        "key-not-string.json": service_account(["-----BEGIN PRIVATE KEY-----"]),
        "escaped.json": service_account(rsa, project_id="herald\\u002dfuzz",
                                        client_email="h\u00e9rald@example.com"),
        "duplicate.json": b'{"project_id":"a","project_id":"b"}',
        "array.json": b"[]",
        "not-json": b"project_id=herald",
    }
    # json.dumps escapes the backslash of the \u002d above; put the escape back.
    corpus["fcm_account"]["escaped.json"] = corpus["fcm_account"]["escaped.json"].replace(b"\\\\u", b"\\u")

    corpus["secretbox"] = {
        "box": bytes([4]) + b"ad:1" + secretbox(b"ad:1", b"device token 0123456789abcdef", bytes(range(24))),
        "box-empty": bytes([0]) + secretbox(b"", b"", bytes(24)),
        "box-no-ad": bytes([0]) + secretbox(b"", b"p256dh and auth", bytes(range(1, 25))),
        "short": bytes([0, 1, 2, 3]),
        "version-2": bytes([0, 2]) + bytes(40),
        "overhead-only": bytes([0, 1]) + bytes(40),
    }

    def webpush(body_size: int, plaintext: bytes, eph: bytes = unb64u(RFC8291_AS_PRIVATE)) -> bytes:
        return (body_size.to_bytes(2, "big") + unb64u(RFC8291_UA_PRIVATE) + unb64u(RFC8291_AUTH) +
                unb64u(RFC8291_SALT) + eph + plaintext)

    corpus["webpush_seal"] = {
        "rfc8291": webpush(0, RFC8291_PLAINTEXT),
        "padded-2816": webpush(2816, RFC8291_PLAINTEXT),
        "padded-104-empty": webpush(104, b""),
        "padded-104-one": webpush(104, b"x"),
        "max-4096": webpush(4096, b"m" * (4096 - 103)),
        "body-103": webpush(103, b""),
        "body-4097": webpush(4097, b""),
        "too-large": webpush(200, b"y" * 98),
        "eph-zero": webpush(0, b"z", bytes(32)),
        "eph-order": webpush(0, b"z", ORDER.to_bytes(32, "big")),
    }

    def jwt(aud: bytes, sub: bytes, kid: bytes = b"ABCDE12345", team: bytes = b"TEAM123456",
            offset: int = 3600) -> bytes:
        return b"\0".join([aud, sub, kid, team, (offset & 0xFFFFFFFF).to_bytes(4, "big")])

    corpus["jwt"] = {
        "vapid": jwt(b"https://push.example.net", b"mailto:ops@example.com"),
        "vapid-port": jwt(b"https://fcm.googleapis.com:443", b"https://example.com/contact"),
        "vapid-ipv6": jwt(b"https://[2001:db8::1]:8443", b"mailto:a@b"),
        "vapid-max-ttl": jwt(b"https://updates.push.services.mozilla.com", b"mailto:a@b", offset=86400),
        "vapid-expired": jwt(b"https://push.example.net", b"mailto:a@b", offset=0),
        "vapid-too-long": jwt(b"https://push.example.net", b"mailto:a@b", offset=86401),
        "audience-path": jwt(b"https://push.example.net/wpush/v2", b"mailto:a@b"),
        "audience-http": jwt(b"http://push.example.net", b"mailto:a@b"),
        "audience-userinfo": jwt(b"https://user@push.example.net", b"mailto:a@b"),
        "subject-bare": jwt(b"https://push.example.net", b"ops@example.com"),
        "subject-utf8": jwt(b"https://push.example.net", "mailto:\u00e9@example.com".encode()),
        "subject-latin1": jwt(b"https://push.example.net", b"mailto:\xe9@example.com"),
        "apns-bad-kid": jwt(b"https://a", b"mailto:a@b", kid=b"abcde12345"),
        "apns-short-team": jwt(b"https://a", b"mailto:a@b", team=b"TEAM12345"),
    }

    big = "x" * 300
    requests = {
        "request": b'{"jsonrpc":"2.0","method":"system.health","id":1}',
        "params": b'{"jsonrpc":"2.0","method":"device.register","params":{"user":"u1","platform":"web",'
                  b'"token":"https://push.example.net/x","keys":{"p256dh":"' + b64u(keys.ec_point).encode() +
                  b'","auth":"' + RFC8291_AUTH.encode() + b'"}},"id":"r-1"}',
        "notification": b'{"jsonrpc":"2.0","method":"push.send","params":{"to":{"users":["u1"]},"data":{}}}',
        "batch": b'[{"jsonrpc":"2.0","method":"a","id":1},{"jsonrpc":"2.0","method":"b"},1,[],'
                 b'{"jsonrpc":"2.0","method":"c","params":[1],"id":null}]',
        "batch-notifications": b'[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","method":"b"}]',
        "empty-batch": b"[]",
        "pipelined": b'{"jsonrpc":"2.0","method":"a","id":1}{"jsonrpc":"2.0","method":"b","id":2}\r\n'
                     b'{"jsonrpc":"2.0","method":"c","id":3}\n',
        "scalars": b'1 -0.5e+7 true null "s" xyz ]}',
        "nesting": b'{"jsonrpc":"2.0","method":"m","params":{"a":' + b"[" * 40 + b"{}" + b"]" * 40 + b"},"
                   b'"id":1.0}',
        "too-deep": b"[" * 300 + b"]" * 300,
        "unicode-escapes": b'{"jsonrpc":"2.0","method":"\\u0073ystem.health","params":{"s":"\\ud83d\\ude00'
                           b'\\u2028\\u2029\\u0000\\n\\"\\\\\\/"},"id":"\\u00e9"}',
        "raw-utf8": '{"jsonrpc":"2.0","method":"m","params":{"k":"h\u00e9 \u2028 \U0001F600"},"id":2}'.encode(),
        "lone-surrogate": b'{"jsonrpc":"2.0","method":"m","params":{"k":"\\ud800"},"id":3}',
        "invalid-utf8": b'{"jsonrpc":"2.0","method":"m\xc0\xaf","id":4}',
        "overlong-utf8": b'["\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"]',
        "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","method":"m","id":5}',
        "duplicate-member": b'{"jsonrpc":"2.0","method":"m","id":1,"id":2}',
        "unknown-member": b'{"jsonrpc":"2.0","method":"m","id":1,"extra":true}',
        "bad-version": b'{"jsonrpc":"1.0","method":"m","id":1}',
        "bad-id": b'{"jsonrpc":"2.0","method":"m","id":{"a":1}}',
        "numbers": b'[0,-0,1e5,1E-5,0.1,123456789012345678901234567890,-1.5e308,01,+1,1.,.5]',
        "trailing-comma": b'{"jsonrpc":"2.0","method":"m","id":1,}',
        "unterminated": b'{"jsonrpc":"2.0","method":"m","params":{"s":"abc',
        "escaped-quote-in-string": b'{"a":"\\"}"}',
    }
    corpus["jsonrpc"] = {name: b"\xff\x05" + text for name, text in requests.items()}
    # Small framer limits (1 + 3 * L bytes) and other chunkings.
    corpus["jsonrpc"]["limit-28-pipelined"] = b"\x09\x00" + requests["pipelined"]
    corpus["jsonrpc"]["limit-49-batch"] = b"\x10\x03" + requests["batch"]
    corpus["jsonrpc"]["limit-1-scalars"] = b"\x00\x01" + requests["scalars"]
    corpus["jsonrpc"]["limit-301-big-string"] = b"\x64\x07" + ('"' + big + '"').encode()
    corpus["jsonrpc"]["chunks-1"] = b"\xff\x00" + requests["unicode-escapes"]
    corpus["jsonrpc"]["chunks-4096"] = b"\xff\x07" + requests["params"]
    return corpus


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = seeds(Keys(tmp))
    for target, files in corpus.items():
        directory = os.path.join(out, target)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        for name, data in files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(files)} seeds")


if __name__ == "__main__":
    main()
