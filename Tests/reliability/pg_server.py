"""A throw-away PostgreSQL server for the Python tests, run by scripts/pg-test-server.sh (the Swift
tests' ``PostgresServer`` uses the same script).

``PostgresServer()`` runs initdb into a fresh directory under /tmp (superuser role ``herald``, a
random password in ``password_file``, scram-sha-256), starts the server listening only on a Unix
socket in that directory, with fsync off. ``stop()`` / ``start()`` / ``restart()`` simulate a
database outage on the same data; ``destroy()`` (also at exit, and on leaving a ``with`` block)
stops it and removes the directory. ``psql(sql)`` runs SQL with the Debian client, for set-up and
checks: the daemon itself connects with ``dsn`` and ``password_file``.

For the daemons: ``create_database()`` makes a fresh database (one per test, or one shared by the
instances of a test), and ``store_config(database)`` the ``[store]`` keys that point a daemon at it.
``shared()`` is one server for the whole process (the hostile suite on PostgreSQL, the crash
harness), removed at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "pg-test-server.sh"


class PostgresServer:
    def __init__(self, directory: str | os.PathLike | None = None):
        self.dir = Path(directory or f"/tmp/herald-pg-{uuid.uuid4().hex[:8]}")
        self.password_file = self.dir / "password"
        self.socket_dir = self.dir / "run"
        self.log = self.dir / "server.log"
        self.dsn = self._run("start")
        atexit.register(self.destroy)

    def _run(self, command: str) -> str:
        done = subprocess.run(["/bin/bash", str(SCRIPT), command, str(self.dir)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"pg-test-server.sh {command} {self.dir} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def stop(self) -> None:
        """Fast shutdown: every open connection is cut; the data stays."""
        self._run("stop")

    def start(self) -> None:
        self._run("start")

    def restart(self) -> None:
        self._run("restart")

    def destroy(self) -> None:
        if self.dir.exists():
            self._run("destroy")

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def psql(self, sql: str, database: str = "postgres", separator: str = "|") -> str:
        """Runs ``sql`` with psql (unaligned, tuples only) and returns its output; raises on an error."""
        psql = shutil.which("psql") or "/usr/bin/psql"
        env = dict(os.environ, PGPASSWORD=self.password())
        done = subprocess.run(
            [psql, "-X", "-q", "-A", "-t", "-F", separator, "-v", "ON_ERROR_STOP=1", "-d",
             f"host={self.socket_dir} user=herald dbname={database}", "-c", sql],
            capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def create_database(self, name: str | None = None) -> str:
        """A new empty database owned by ``herald``; its name."""
        name = name or f"herald_{uuid.uuid4().hex[:12]}"
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: letters, digits and _ only")
        self.psql(f'CREATE DATABASE "{name}"')
        return name

    def dsn_for(self, database: str) -> str:
        """The libpq connection string of ``database`` (no password: that is in ``password_file``)."""
        return f"host={self.socket_dir} port=5432 dbname={database} user=herald"

    def store_config(self, database: str, **extra) -> dict:
        """The ``[store]`` keys of a daemon on ``database`` (``extra``: lease, pool_size…)."""
        return {"backend": "postgres", "dsn": self.dsn_for(database), "password_file": str(self.password_file),
                **extra}

    def query(self, sql: str, database: str) -> list[list[str]]:
        """Rows of ``sql`` on ``database``, each a list of column texts (no column may hold a newline)."""
        out = self.psql(sql, database=database, separator="\x1f")
        return [line.split("\x1f") for line in out.splitlines() if line]

    def __enter__(self) -> "PostgresServer":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()


_shared: PostgresServer | None = None


def shared() -> PostgresServer:
    """One server for the whole process (started on first use, removed at exit)."""
    global _shared
    if _shared is None or not _shared.dir.exists():
        _shared = PostgresServer()
    return _shared
