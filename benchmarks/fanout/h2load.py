"""h2load (Debian's nghttp2-client) against the sink: the HTTP/2 request rate of
this machine with no crypto and no logic, the ceiling the senders are compared to.

Requests are shaped like the providers' (path, headers of about the size
Herald sends, the same body sizes: a 2,816-byte Web Push record), so h2load
makes the sink do the same work per request as the senders do.
"""
import os
import re
import shutil
import subprocess

from sink import MAX_STREAMS

H2LOAD = shutil.which("h2load") or "/usr/bin/h2load"

_JWT = "eyJhbGciOiJFUzI1NiIsImtpZCI6IkFCQzEyM0RFRkcifQ." + "x" * 60 + "." + "y" * 86

SHAPES = {
    # platform: (path, headers, body bytes)
    "apns": ("/3/device/{token}",
             ["apns-topic: com.example.app", "apns-push-type: background", "apns-priority: 5",
              "apns-expiration: 1796245659", "apns-collapse-id: 0123456789abcdef0123456789abcdef",
              "content-type: application/json", "authorization: bearer " + _JWT],
             b'{"aps":{"content-available":1},"kind":"notification","data":{"msg":"h2load"}}'),
    "fcm": ("/v1/projects/herald-bench/messages:send",
            ["content-type: application/json", "authorization: Bearer ya29." + "z" * 120],
            b'{"message":{"token":"bench-h2load-0000-0","data":{"kind":"notification","msg":"h2load"},'
            b'"android":{"priority":"HIGH","ttl":"86400s"}}}'),
    "web": ("/push/h2load-{token}",
            ["ttl: 86400", "urgency: high", "content-encoding: aes128gcm",
             "topic: AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
             "authorization: vapid t=" + _JWT + ",k=B" + "k" * 86],
            b"\x00" * 2816),
}


def version():
    try:
        out = subprocess.run([H2LOAD, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip()
    except OSError:
        return None


class H2Load:
    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.bodies = {}
        for platform, (_, _, body) in SHAPES.items():
            p = os.path.join(directory, f"body-{platform}")
            with open(p, "wb") as f:
                f.write(body)
            self.bodies[platform] = p
        self.runs = 0

    def _cmd(self, platform, origin, extra):
        path, headers, _ = SHAPES[platform]
        cmd = [H2LOAD, "-t", "1", "-d", self.bodies[platform]]
        for h in headers:
            cmd += ["-H", h]
        return cmd + extra + [origin + path.format(token="0f" * 32)]

    def _start(self, cmd, tag):
        self.runs += 1
        out = open(os.path.join(self.dir, f"{tag}-{self.runs}.out"), "w+")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return proc, out

    @staticmethod
    def _finish(proc, out):
        """Waits for the process with its rusage: (status, cpu_s, maxrss_kb, output)."""
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
        out.close()
        return proc.returncode, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, text

    def message(self, targets):
        """One "message": for each (platform, origin, n) one h2load process with
        all n streams at once (-n n -m n, on as many connections as the sink's
        limit of MAX_STREAMS streams per connection needs), all started together. Returns (seconds, succeeded, cpu_s, peak_rss_kb, problems):
        seconds is the longest per-process span from its first request's start
        to its last response's end (from --log-file, so process start-up and
        the TLS handshake are not counted)."""
        started = []
        for i, (platform, origin, n) in enumerate(targets):
            log = os.path.join(self.dir, f"msg-{i}.log")
            if os.path.exists(log):
                os.unlink(log)
            conns = -(-n // MAX_STREAMS)  # as many connections as the sink's stream limit needs
            cmd = self._cmd(platform, origin, ["-n", str(n), "-c", str(conns), "-m", str(min(n, MAX_STREAMS)),
                                               "--log-file", log])
            started.append((self._start(cmd, "msg"), log, n))
        span, ok, cpu, rss, problems = 0.0, 0, 0.0, 0, []
        for (proc, out), log, n in started:
            status, c, r, text = self._finish(proc, out)
            cpu += c
            rss = max(rss, r)
            starts, ends, good = [], [], 0
            try:
                with open(log) as f:
                    for line in f:
                        parts = line.split("\t")
                        if len(parts) < 3:
                            continue
                        s, code, d = int(parts[0]), int(parts[1]), int(parts[2])
                        starts.append(s)
                        ends.append(s + d)
                        if 200 <= code < 300:
                            good += 1
            except OSError:
                pass
            if status != 0 or good != n:
                problems.append(f"h2load exit {status}, {good}/{n} 2xx: {text.strip().splitlines()[-3:]}")
            ok += good
            if starts:
                span = max(span, (max(ends) - min(starts)) / 1e6)
        return span, ok, cpu, rss, problems

    def sustained(self, platform, origin, seconds, connections=2, streams=100):
        """h2load -c 2 -m 100 -t 1 -D seconds: requests/s, as the issue's ceiling."""
        cmd = self._cmd(platform, origin, ["-c", str(connections), "-m", str(streams), "-D", str(seconds)])
        status, cpu, rss, text = self._finish(*self._start(cmd, "sustained"))
        m = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s", text)
        r = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded", text)
        codes = re.search(r"status codes: (\d+) 2xx", text)
        if not m or not r:
            raise RuntimeError(f"h2load failed (exit {status}):\n{text[-2000:]}")
        wall = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        ok = int(codes.group(1)) if codes else int(r.group(3))
        return {"seconds": wall, "requests": int(r.group(1)), "succeeded": ok,
                "req_per_s": ok / wall if wall > 0 else None, "cpu_s": cpu, "peak_rss_kb": rss,
                "exit": status, "command": " ".join(cmd[:1] + cmd[-7:])}
