"""What the benchmark drivers share: a `herald serve` child process and a
newline-framed JSON-RPC client over its Unix socket (standard library only)."""
import json
import os
import signal
import socket
import subprocess
import time


def proc_cpu_seconds(pid):
    """utime + stime of a process (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def tail(path, n=30):
    """The last `n` lines of a file, or "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return ""


def stop_process(proc, timeout=30):
    """SIGTERM, then wait (SIGKILL after `timeout`); returns the exit status."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def connect(path, timeout=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def request(rid, method, params=None):
    """One JSON-RPC request, compact, newline-terminated."""
    return (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}},
                       separators=(",", ":")).encode() + b"\n")


class LineReader:
    """Newline-framed responses from a socket, with as little Python per line as possible."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def line(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 1:]
                return line
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("herald closed the connection")
            self.buf += chunk


class Client:
    """One connection to the daemon: newline-framed JSON-RPC."""

    def __init__(self, path, timeout=120):
        self.sock = connect(path, timeout)
        self.reader = LineReader(self.sock)
        self.next_id = 1

    def call(self, method, params=None):
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(request(rid, method, params))
        return json.loads(self.reader.line())

    def pipelined(self, method, params_list, chunk=200):
        """Many calls written ahead of their answers; answers in request order."""
        out = []
        for start in range(0, len(params_list), chunk):
            part = params_list[start:start + chunk]
            ids = list(range(self.next_id, self.next_id + len(part)))
            self.next_id += len(part)
            self.sock.sendall(b"".join(request(i, method, p) for i, p in zip(ids, part)))
            by_id = {}
            for _ in part:
                obj = json.loads(self.reader.line())
                by_id[obj.get("id")] = obj
            out += [by_id.get(i) for i in ids]
        return out

    def close(self):
        self.sock.close()


class HeraldProcess:
    """`herald serve` on `directory` with `config` (INI text, whose socket must be
    `directory/herald.sock`); returns once the socket accepts connections."""

    def __init__(self, binary, directory, config, start_timeout=20):
        self.dir = directory
        self.socket_path = os.path.join(directory, "herald.sock")
        self.config = os.path.join(directory, "herald.conf")
        with open(self.config, "w") as f:
            f.write(config)
        self.log_path = os.path.join(directory, "herald.stderr.log")
        self.log = open(self.log_path, "wb")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        self.proc = subprocess.Popen([binary, "serve", "--config", self.config], stdout=self.log,
                                     stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                connect(self.socket_path).close()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError("herald did not start:\n" + self.stderr_tail())

    def cpu_seconds(self):
        return proc_cpu_seconds(self.proc.pid)

    def alive(self):
        return self.proc.poll() is None

    def stderr_tail(self, n=30):
        return tail(self.log_path, n)

    def stop(self):
        """SIGTERM, then wait; returns the exit status."""
        status = stop_process(self.proc)
        self.log.close()
        return status


# Added for the fan-out benchmark (benchmarks/fanout): peak memory of a process.

def proc_peak_rss_kb(pid):
    """VmHWM (peak resident set size, KiB) of a process, from /proc/PID/status; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss(pid):
    """Resets VmHWM of a process to its current RSS (`5` to /proc/PID/clear_refs,
    Linux 4.0+; needs the right to write there, e.g. the same user). True when done."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
