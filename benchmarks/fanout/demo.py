#!/usr/bin/env python3
"""`make demo`: the whole path working, on loopback, in about half a minute.

Starts the benchmark sink (nginx standing in for APNs, FCM and five Web Push
services), starts `herald serve` against it on a temporary directory,
registers 500 devices for 200 users, sends one message with `herald send`
(no wait), follows it with `herald status ID --watch` (the live progress
line), prints the final counts and the path of the benchmark report, and
stops everything.

    .venv/bin/python benchmarks/fanout/demo.py [--herald .build/debug/herald]
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import fixture  # noqa: E402
from herald_proc import HeraldProcess  # noqa: E402
from sink import Sink  # noqa: E402

REPO = HERE.parent.parent
REPORT = REPO / "benchmarks/results/REPORT.md"


def say(text=""):
    print(text, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--herald", default=str(REPO / ".build/debug/herald"))
    ap.add_argument("--keep", action="store_true", help="leave the temporary directory in place")
    args = ap.parse_args()
    herald_bin = os.path.abspath(args.herald)
    if not os.access(herald_bin, os.X_OK):
        raise SystemExit(f"{herald_bin} is not an executable (swift build --product herald)")
    rel = os.path.relpath(herald_bin, os.getcwd())

    tmp = tempfile.mkdtemp(prefix="herald-demo-")
    sink = daemon = None
    status = 1
    try:
        say("== 1. the providers: nginx on loopback standing in for them")
        sink = Sink(os.path.join(tmp, "sink"), web_origins=5)
        say(f"   APNs      {sink.apns_url}")
        say(f"   FCM       {sink.fcm_url}  (OAuth token endpoint {sink.fcm_url}/token)")
        say(f"   Web Push  {', '.join(sink.web_origin(i) for i in range(5))}")
        say(f"   TLS with a CA made for this run: {sink.ca}")

        say("== 2. herald serve, pointed at them")
        keys = fixture.provider_keys(tmp, sink)
        daemon = HeraldProcess(herald_bin, tmp, fixture.herald_config(tmp, sink, keys, log_level="info"))
        sock = daemon.socket_path
        say(f"   config {daemon.config}, socket {sock}")
        health = subprocess.run([herald_bin, "health", "--socket", sock], capture_output=True, text=True)
        say("   " + (health.stdout.strip().replace("\n", "\n   ") or health.stderr.strip()))

        say("== 3. 500 devices for 200 users")
        client = fixture.Client(sock)
        t0 = time.perf_counter()
        # 100 users with a browser, an iPhone and an Android phone; 100 with a browser and an iPhone.
        users_a, _ = fixture.register(client, sink, "alpha", 0, 100, (1, 1, 1))
        users_b, _ = fixture.register(client, sink, "beta", 1, 100, (1, 1, 0))
        users = users_a + users_b
        client.close()
        say(f"   registered 500 devices (200 Web Push over 5 origins, 200 APNs, 100 FCM) for {len(users)} users "
            f"in {time.perf_counter() - t0:.1f} s")

        say("== 4. one message to all 200 users")
        cmd = [herald_bin, "send", "--socket", sock, "--data", "thread=demo", "--idempotency-key", "demo-1"]
        for u in users:
            cmd += ["--user", u]
        say(f"   {rel} send --socket {sock} --data thread=demo "
            f"--user {users[0]} --user {users[1]} ... ({len(users)} users)")
        sent = subprocess.run(cmd, capture_output=True, text=True)
        if sent.returncode != 0:
            raise RuntimeError(f"herald send failed: {sent.stderr.strip()}")
        accepted = json.loads(sent.stdout)
        mid = accepted["message_id"]
        say(f"   accepted: message {mid}, {accepted['devices']} devices")

        say(f"== 5. {rel} status {mid} --watch")
        watch = subprocess.run([herald_bin, "status", mid, "--watch", "--interval-ms", "10", "--socket", sock],
                               stdout=subprocess.PIPE, text=True)  # the progress line goes to the terminal
        if watch.returncode != 0:
            raise RuntimeError("herald status --watch failed")
        final = json.loads(watch.stdout)
        counts = {k: v for k, v in final["counts"].items() if v}
        say(f"   final: state {final['state']}, " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        stats = subprocess.run([herald_bin, "stats", "--socket", sock], capture_output=True, text=True)
        tr = json.loads(stats.stdout).get("transports", {}) if stats.returncode == 0 else {}
        say("   per platform: " + ", ".join(f"{p} delivered {t['delivered']}" for p, t in tr.items() if t.get("sent")))
        status = 0 if final["state"] == "complete" and counts.get("delivered") == accepted["devices"] else 1

        say()
        say(f"Benchmark report (make bench): {os.path.relpath(REPORT, os.getcwd())}"
            + ("" if REPORT.exists() else " (not written yet)"))
    except BaseException:
        if daemon is not None:
            print("herald stderr (tail):\n" + daemon.stderr_tail(), file=sys.stderr)
        raise
    finally:
        if daemon is not None:
            daemon.stop()
        if sink is not None:
            sink.stop()
        if args.keep:
            say(f"(kept {tmp})")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
