"""The fan-out benchmark's PostgreSQL server and what it costs.

`BenchPostgres` is the tests' private server (Tests/reliability/pg_server.py, run by
scripts/pg-test-server.sh: initdb into a temporary directory, a Unix socket only, as the
unprivileged `postgres` user when run as root), made durable for a benchmark when asked
(`HERALD_PG_DURABLE=1`: fsync, synchronous_commit and full_page_writes on, PostgreSQL's
defaults) so that it compares with SQLite's `synchronous = full`.

`server_cpu_seconds(postmaster)` is the CPU (utime + stime) the whole server has used: the
postmaster's own, the children it has reaped (cutime + cstime: a backend or autovacuum worker
that exited), and every live child (connection backends, WAL writer, checkpointer...). The
difference over a phase is the database's CPU in that phase, exited children included.
"""
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "Tests" / "reliability"))
from pg_server import SCRIPT, PostgresServer  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


class BenchPostgres(PostgresServer):
    """A private PostgreSQL server for one benchmark run; `durable`: fsync and synchronous
    commits on (the default here), else the tests' fsync off."""

    def __init__(self, directory, durable=True):
        self.durable = durable
        super().__init__(directory)

    def _run(self, command):
        env = dict(os.environ, HERALD_PG_DURABLE="1" if self.durable else "0")
        done = subprocess.run(["/bin/bash", str(SCRIPT), command, str(self.dir)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=180, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"pg-test-server.sh {command} {self.dir} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def enable_statement_stats(self):
        """Loads pg_stat_statements (a restart of this private server), so that a phase's
        statements can be counted: `statements(database)`."""
        if "pg_stat_statements" not in self.psql("SHOW shared_preload_libraries"):
            self.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            if os.environ.get("HERALD_BENCH_PG_LOG"):
                # Every statement with its time, for a look at one message's sequence.
                self.psql("ALTER SYSTEM SET log_min_duration_statement = 0")
                self.psql("ALTER SYSTEM SET log_line_prefix = '%m [%p] '")
            self._run("restart")
        self.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def destroy(self):
        """Removes the server; HERALD_BENCH_PG_LOG=PATH keeps its log (every statement) there."""
        keep = os.environ.get("HERALD_BENCH_PG_LOG")
        log = self.dir / "server.log"
        if keep and log.exists():
            shutil.copyfile(log, keep)
        super().destroy()

    def statements(self, database):
        """Statements run on `database` so far (pg_stat_statements' calls, BEGIN, COMMIT and
        SAVEPOINT included: each is a round trip)."""
        rows = self.query("SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
                          f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{database}'", "postgres")
        return int(rows[0][0]) if rows else 0

    def top_statements(self, database, n=16):
        """[(calls, total ms, mean ms, rows, statement's first 100 characters)] of the statements
        on `database` that took the most time (pg_stat_statements' total_exec_time; rows: what
        they returned or changed, summed)."""
        rows = self.query("SELECT s.calls, round(s.total_exec_time::numeric, 1), round(s.mean_exec_time::numeric, 3), "
                          "s.rows, regexp_replace(left(s.query, 100), '\\s+', ' ', 'g') FROM pg_stat_statements s "
                          f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{database}' "
                          f"ORDER BY s.total_exec_time DESC LIMIT {int(n)}", "postgres")
        return [(int(c), float(t), float(m), int(r), q) for c, t, m, r, q in rows]

    def table_sizes(self, database):
        """{relation: bytes} of the queue's tables and their indexes on `database`."""
        rows = self.query(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i') AND (c.relname LIKE 'deliveries%' "
            "OR c.relname LIKE 'messages%') ORDER BY c.relname", database)
        return {name: int(size) for name, size in rows}

    def postmaster_pid(self):
        """The postmaster's pid: the first line of DATA/postmaster.pid."""
        with open(self.dir / "data" / "postmaster.pid") as f:
            return int(f.readline())

    def settings(self, names=("server_version", "fsync", "synchronous_commit", "full_page_writes",
                              "shared_buffers", "max_connections", "wal_level")):
        rows = self.query("SELECT name, current_setting(name) FROM pg_settings WHERE name IN ("
                          + ",".join(f"'{n}'" for n in names) + ")", "postgres")
        out = {name: setting for name, setting in rows}
        out["server_version"] = self.psql("SHOW server_version")
        return out


def _stat(pid):
    """(ppid, utime + stime, cutime + cstime) in ticks from /proc/PID/stat; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is the state (stat field 3): ppid is field 4, utime..cstime 14-17.
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu_seconds(postmaster):
    """utime + stime of the postmaster, of its reaped children and of its live children."""
    own = _stat(postmaster)
    if own is None:
        return float("nan")
    ticks = own[1] + own[2]
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == postmaster:
            continue
        st = _stat(entry.name)
        if st is not None and st[0] == postmaster:
            ticks += st[1]
    return ticks / TICK


class ServerMeter:
    """The server's CPU over a block (`with ServerMeter(pid) as m: ...; m.cpu`)."""

    def __init__(self, postmaster):
        self.postmaster = postmaster

    def __enter__(self):
        self.c0 = server_cpu_seconds(self.postmaster)
        return self

    def __exit__(self, *exc):
        self.cpu = server_cpu_seconds(self.postmaster) - self.c0
