"""The benchmark sink: Debian's nginx on loopback with TLS (a CA made for this
run) and HTTP/2, answering like the push providers, so the receiver is never
the bottleneck.

- APNs (`POST /3/device/<token>`): 200, empty body, `apns-id` echoing the
  request's (a generated UUID when the request has none, as Apple does).
- FCM (`POST /v1/projects/<p>/messages:send`): 200 `{"name": ".../messages/<id>"}`;
  `POST /token` (the service account's `token_uri`): an OAuth2 access token.
- Web Push (`POST /push/<id>`): 201 with a `Location`, on several loopback
  addresses (127.0.0.2 ... 127.0.0.N), each a distinct origin, since real
  subscriptions point at several push services.

nginx reads every request body before it answers (a mirror subrequest with
`mirror_request_body on`, then the answer from a named location): a `return`
in the request's own location would answer without reading the body and end
the HTTP/2 stream with RST_STREAM(NO_ERROR), which curl reports as an error.

It runs as its own nginx (`nginx -p DIR -c DIR/nginx.conf`, `daemon off`,
pid, logs and temp files under DIR) on ports the OS picked a moment before;
it never touches the system nginx.

With `access_log=True` nginx also keeps the receiver's own record of every
push request (DIR/access.log, one JSON object a line: time at the end of the
request and time since its start, status, listen address and port, path, and
for FCM the `message.token` of the body, the only place FCM names the device), buffered (`buffer=256k flush=1s`) so that it
costs the measured senders little. h2load's requests (user agent `h2load`)
and the OAuth token requests are not logged. `records()` reads it back;
`wait_records()` waits, with a deadline, until nginx has written what is
expected (it writes its buffer every second and at exit).
"""
import json
import datetime
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MAX_STREAMS = 200  # per HTTP/2 connection; see the note in CONFIG


def _write_key(path, key):
    with open(path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    os.chmod(path, 0o600)


def make_ca(directory, addresses):
    """A CA and a server certificate for `addresses` (IP SANs) and localhost;
    returns (ca_path, cert_path, key_path)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Herald bench sink CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName("localhost")] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "herald-bench-sink")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path = os.path.join(directory, "ca.pem")
    cert_path = os.path.join(directory, "server.pem")
    key_path = os.path.join(directory, "server.key")
    with open(ca_path, "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(cert_path, "wb") as f:
        # The chain nginx sends: the leaf, then the CA.
        f.write(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return ca_path, cert_path, key_path


def free_port(host="127.0.0.1", also=()):
    """A TCP port free on `host` and on every address in `also` (the OS picks it)."""
    for _ in range(50):
        s = socket.socket()
        s.bind((host, 0))
        port = s.getsockname()[1]
        s.close()
        ok = True
        for a in also:
            t = socket.socket()
            try:
                t.bind((a, port))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok:
            return port
    raise RuntimeError("no free port")


CONFIG = """\
# Generated by benchmarks/fanout/sink.py for one benchmark run.
{user}worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log {log_level};
worker_rlimit_nofile 65536;

events {{
    worker_connections 16384;
    multi_accept on;
}}

http {{
    access_log off;
    # The receiver's record of the pushes (only with access_log=True): one JSON
    # object a line. $msec is nginx's time at the end of the request, $request_time
    # the time since its first bytes were read (both in whole ms, from the time nginx
    # caches at each event-loop wake-up): t - rt is when the request reached nginx. The
    # FCM device is the body's message.token (read by the mirror, in memory).
    log_format sink_push escape=json
        '{{"t":$msec,"rt":$request_time,"s":$status,"a":"$server_addr","p":$server_port,'
        '"u":"$request_uri","fcm":"$sink_fcm_token","ua":"$http_user_agent"}}';
    map $http_user_agent $sink_loggable {{
        "~^h2load" 0;
        default 1;
    }}
    map $request_body $sink_fcm_token {{
        "~\\"token\\"\\s*:\\s*\\"(?<tok>[^\\"]*)\\"" $tok;
        default "";
    }}
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;

    # Like the providers: long-lived HTTP/2 connections with many streams and
    # no GOAWAY after nginx's default 1000 requests. Streams per connection are
    # capped at {max_streams}, not APNs' 1000: nginx 1.22 stops reusing the nodes
    # of closed streams once more than 255 are closed at a time (an 8-bit
    # counter wraps), so with more streams in flight every request leaks a node
    # into the stream index and each frame walks ever longer lists (measured:
    # h2load -c 1 -m 300 fell from 16,000 to 9,000 req/s within 12 s with a
    # worker at 100% CPU; -m 200 held 49,000-53,000 req/s).
    keepalive_requests 1000000000;
    keepalive_timeout 900s;
    http2_max_concurrent_streams {max_streams};
    http2_body_preread_size 64k;
    client_body_buffer_size 64k;
    client_max_body_size 1m;
    server_tokens off;

    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;

    # APNs echoes the request's apns-id and makes one (a UUID) when it has none.
    map $request_id $sink_uuid {{
        "~^(?<a>.{{8}})(?<b>.{{4}})(?<c>.{{4}})(?<d>.{{4}})(?<e>.{{12}})$" "$a-$b-$c-$d-$e";
    }}
    map $http_apns_id $sink_apns_id {{
        "" $sink_uuid;
        default $http_apns_id;
    }}

    # Every provider location: the mirror reads the whole request body first
    # (precontent phase); the static handler then finds no file (the root is
    # empty), and error_page turns that 404 into the provider's answer.
    server {{
        listen 127.0.0.1:{apns_port} ssl http2 reuseport;
        server_name apns;
        root {dir}/empty;
        location /3/device/ {{
{access_log}
            mirror /_drain;
            mirror_request_body on;
            log_not_found off;
            error_page 404 =200 @apns;
        }}
        location @apns {{
{access_log}
            add_header apns-id $sink_apns_id always;
            return 200;
        }}
        location = /_drain {{ internal; return 204; }}
        location / {{
{access_log}
            return 404;
        }}
    }}

    server {{
        listen 127.0.0.1:{fcm_port} ssl http2 reuseport;
        server_name fcm;
        root {dir}/empty;
        location /v1/projects/ {{
{access_log}
            mirror /_drain;
            mirror_request_body on;
            log_not_found off;
            error_page 404 =200 @fcm;
        }}
        location @fcm {{
{access_log}
            default_type application/json;
            return 200 '{{"name":"projects/herald-bench/messages/0:$request_id"}}';
        }}
        location = /token {{
            mirror /_drain;
            mirror_request_body on;
            log_not_found off;
            error_page 404 =200 @token;
        }}
        location @token {{
            default_type application/json;
            return 200 '{{"access_token":"ya29.sink-$request_id","expires_in":3600,"token_type":"Bearer"}}';
        }}
        location = /_drain {{ internal; return 204; }}
        location / {{
{access_log}
            return 404;
        }}
    }}

    server {{
{web_listens}
        server_name webpush;
        root {dir}/empty;
        location /push/ {{
{access_log}
            mirror /_drain;
            mirror_request_body on;
            log_not_found off;
            error_page 404 =201 @webpush;
        }}
        location @webpush {{
{access_log}
            add_header Location "https://$host:$server_port/message/$request_id" always;
            return 201;
        }}
        location = /_drain {{ internal; return 204; }}
        location / {{
{access_log}
            return 404;
        }}
    }}
}}
"""


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class Sink:
    """nginx as APNs, FCM and Web Push on loopback. `web_origins` is the number
    of Web Push origins (127.0.0.2, 127.0.0.3, ...)."""

    def __init__(self, directory, web_origins=5, workers=2, log_level="warn", access_log=False):
        self.dir = os.path.abspath(directory)
        self.access_log = os.path.join(self.dir, "access.log") if access_log else None
        # Every location that answers a push request, and the 404 of an unknown
        # path, logs to the one file (one shared buffer; the log phase uses the
        # configuration of the location that answered, the named one after
        # error_page).
        access = (f"            access_log {self.access_log} sink_push buffer=256k flush=1s if=$sink_loggable;"
                  if access_log else "")
        for sub in ("tmp", "empty", "logs"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.web_hosts = [f"127.0.0.{2 + i}" for i in range(web_origins)]
        self.ca, cert, key = make_ca(self.dir, ["127.0.0.1"] + self.web_hosts)
        self.workers = workers
        self.proc = None
        # A master started as root hands the workers to `nobody`, who cannot
        # enter a 0700 temporary directory (every request would be 403): the
        # workers stay with the user who runs the benchmark.
        user = "user root;\n" if os.geteuid() == 0 else ""
        last_error = ""
        for _ in range(5):  # a port the OS gave may be taken before nginx binds it
            self.apns_port = free_port()
            self.fcm_port = free_port()
            self.web_port = free_port(self.web_hosts[0], also=self.web_hosts[1:])
            if len({self.apns_port, self.fcm_port, self.web_port}) < 3:
                continue
            self.conf = os.path.join(self.dir, "nginx.conf")
            listens = "\n".join(f"        listen {h}:{self.web_port} ssl http2 reuseport;"
                                for h in self.web_hosts)
            with open(self.conf, "w") as f:
                f.write(CONFIG.format(dir=self.dir, cert=cert, key=key, workers=workers, user=user, log_level=log_level,
                                      max_streams=MAX_STREAMS, access_log=access,
                                      apns_port=self.apns_port, fcm_port=self.fcm_port,
                                      web_listens=listens))
            self.log_path = os.path.join(self.dir, "nginx.stderr.log")
            log = open(self.log_path, "ab")
            # -e: nginx 1.19.5+ opens this error log before reading the config,
            # instead of the compiled-in /var/log/nginx/error.log.
            self.proc = subprocess.Popen(
                [NGINX, "-p", self.dir + "/", "-c", self.conf, "-e", os.path.join(self.dir, "error.log"),
                 "-g", "daemon off;"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            if self._wait_ready():
                return
            last_error = self.error_tail()
            self.stop()
        raise RuntimeError("nginx did not start:\n" + last_error)

    def _wait_ready(self, timeout=15):
        deadline = time.monotonic() + timeout
        targets = [("127.0.0.1", self.apns_port), ("127.0.0.1", self.fcm_port)] + \
                  [(h, self.web_port) for h in self.web_hosts]
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                for t in targets:
                    socket.create_connection(t, timeout=1).close()
                if len(self.worker_pids()) >= self.workers:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def error_tail(self, n=20):
        out = []
        for p in (self.log_path, os.path.join(self.dir, "error.log")):
            try:
                with open(p, "rb") as f:
                    out += f.read().decode("utf-8", "replace").splitlines()[-n:]
            except OSError:
                pass
        return "\n".join(out)

    # ---- addresses

    @property
    def apns_url(self):
        return f"https://127.0.0.1:{self.apns_port}"

    @property
    def fcm_url(self):
        return f"https://127.0.0.1:{self.fcm_port}"

    def web_origin(self, i):
        return f"https://{self.web_hosts[i % len(self.web_hosts)]}:{self.web_port}"

    # ---- the receiver's record

    def records(self, offset=0):
        """The access log as a list of dicts (t: seconds since the epoch at the end
        of the request, rt: seconds since its first bytes were read, both in whole
        milliseconds, s: status, a: listen address, p: port, u: path, fcm: the
        FCM body's message.token, ua: user agent), from byte `offset` on (a
        `log_size()` taken earlier). A last line nginx has not finished writing is left out."""
        if not self.access_log:
            raise RuntimeError("the sink was started without access_log=True")
        try:
            with open(self.access_log, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        if lines and not data.endswith(b"\n"):
            lines.pop()  # being written
        out = []
        for line in lines:
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                raise RuntimeError(f"access log: a line that is not JSON: {line[:200]!r}")
        return out

    def log_size(self):
        """The access log's size in bytes now (what nginx has written out of its buffer)."""
        try:
            return os.path.getsize(self.access_log)
        except FileNotFoundError:
            return 0

    def wait_records(self, enough, timeout=30.0, interval=0.1):
        """Reads the access log until `enough(records)` is true or `timeout` passes
        (nginx writes its buffer every second, when it is full, and at exit);
        returns the last records read and whether `enough` held."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.records()
            if enough(recs):
                return recs, True
            if time.monotonic() >= deadline:
                return recs, False
            time.sleep(interval)

    # ---- measuring

    def worker_pids(self):
        return _children(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def cpu_seconds(self):
        """utime + stime of the master and its workers."""
        if not self.proc:
            return 0.0
        return _cpu(self.proc.pid) + sum(_cpu(p) for p in self.worker_pids())

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish, then exit
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
        return self.proc.returncode
