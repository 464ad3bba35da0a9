#!/usr/bin/env python3
"""Crypto benchmark driver: Herald's seal and ES256 figures side by side with
`openssl speed ecdsap256` and Python's http_ece (the reference RFC 8188/8291
implementation), all measured in this run on this machine.

Prints a table and writes benchmarks/results/crypto.json. Figures only: no
threshold here fails anything; targets are shown as met or not met.
"""
import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import machine  # noqa: E402  (benchmarks/machine.py)

SUBSCRIPTIONS = 500
ROUNDS = 5
# The same plaintext the Swift benchmark seals (a content-free push).
PLAINTEXT = b'{"kind":"notification","data":{"conversation":"c_8f14e45fceea167a"},"badge":3}'


def herald_figures(binary):
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        subprocess.run([binary, "--json", tmp.name], check=True, stdout=sys.stderr)
        with open(tmp.name) as f:
            return json.load(f)


def openssl_signs_per_second(seconds):
    out = subprocess.run(
        ["openssl", "speed", "-seconds", str(seconds), "ecdsap256"],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.splitlines():
        m = re.search(r"ecdsa \(nistp256\)\s+\S+s\s+\S+s\s+([\d.]+)\s+([\d.]+)", line)
        if m:
            return float(m.group(1))
    raise RuntimeError("could not read openssl speed output:\n" + out)


def http_ece_us_per_seal():
    """What pywebpush does per subscription: a fresh ephemeral key, then
    http_ece.encrypt (aes128gcm, one record)."""
    subs = []
    for _ in range(SUBSCRIPTIONS):
        ua = ec.generate_private_key(ec.SECP256R1())
        dh = ua.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
        subs.append((dh, os.urandom(16)))

    def one_pass():
        start = time.perf_counter()
        for dh, auth in subs:
            eph = ec.generate_private_key(ec.SECP256R1())
            http_ece.encrypt(PLAINTEXT, private_key=eph, dh=dh, auth_secret=auth,
                             version="aes128gcm")
        return (time.perf_counter() - start) * 1e6 / len(subs)

    one_pass()  # warm-up
    return statistics.median(one_pass() for _ in range(ROUNDS))


def verdict(ok):
    return "met" if ok else "NOT met"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--openssl-seconds", type=int, default=3)
    args = ap.parse_args()

    h = herald_figures(args.bench_bin)
    ossl = openssl_signs_per_second(args.openssl_seconds)
    ece = http_ece_us_per_seal()

    result = {
        "seal_us": round(h["seal_us"], 2),
        "floor_us": round(h["floor_us"], 2),
        "ratio": round(h["ratio"], 3),
        "http_ece_us": round(ece, 2),
        "http_ece_over_seal": round(ece / h["seal_us"], 2),
        "floor_evp_us": round(h["floor_evp_us"], 2),
        "floor_ec_point_us": round(h["floor_ec_point_us"], 2),
        "seal_all_cores_us": round(h["seal_all_cores_us"], 2),
        "core_scaling": round(h["core_scaling"], 2),
        "cores": h["cores"],
        "es256_signs_per_s": round(h["es256_signs_per_s"]),
        "openssl_es256_signs_per_s": round(ossl),
        "es256_vs_openssl": round(h["es256_signs_per_s"] / ossl, 3),
        "subscriptions": SUBSCRIPTIONS,
        "body_bytes": h["body_bytes"],
        "plaintext_bytes": h["plaintext_bytes"],
        "machine": {
            "processor": machine.cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "http_ece": importlib.metadata.version("http_ece"),
            "openssl": subprocess.run(["openssl", "version"], capture_output=True,
                                      text=True).stdout.strip(),
        },
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")

    r = result
    print()
    print(f"Web Push seal, {SUBSCRIPTIONS} prepared subscriptions, body {r['body_bytes']} bytes")
    print(f"  herald, 1 core            {r['seal_us']:9.1f} µs/seal")
    print(f"  herald, {r['cores']} cores            {r['seal_all_cores_us']:9.1f} µs/seal (wall)"
          f"   scaling {r['core_scaling']:.2f}x   [target >= 1.8x: "
          f"{verdict(r['core_scaling'] >= 1.8)}]")
    print(f"  floor (keygen + ECDH)     {r['floor_us']:9.1f} µs"
          f"   (EVP {r['floor_evp_us']:.1f}, EC_POINT {r['floor_ec_point_us']:.1f})")
    print(f"  seal / floor              {r['ratio']:9.3f}"
          f"   [target <= 1.1: {verdict(r['ratio'] <= 1.1)}]")
    print(f"  http_ece (Python)         {r['http_ece_us']:9.1f} µs/seal"
          f"   herald is {r['http_ece_over_seal']:.2f}x faster"
          f"   [target >= 2x: {verdict(r['http_ece_over_seal'] >= 2)}]")
    print("ES256 signatures")
    print(f"  herald                    {r['es256_signs_per_s']:9d} /s")
    print(f"  openssl speed ecdsap256   {r['openssl_es256_signs_per_s']:9d} /s"
          f"   herald/openssl {r['es256_vs_openssl']:.2f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
