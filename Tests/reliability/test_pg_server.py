"""The PostgreSQL test server the multi-host tests start themselves (pg_server.py): Unix socket only,
password required, restartable, removed afterwards."""

import os
import stat
import subprocess

import pytest

from pg_server import PostgresServer


def test_server_lifecycle():
    with PostgresServer() as pg:
        assert f"host={pg.socket_dir}" in pg.dsn and "password" not in pg.dsn
        assert stat.S_IMODE(os.stat(pg.password_file).st_mode) == 0o600
        assert pg.psql("SELECT current_user") == "herald"
        # A Unix socket only: no TCP listener, and fsync off (a test database).
        assert pg.psql("SHOW listen_addresses") == ""
        assert pg.psql("SHOW fsync") == "off"
        # The server does not run as root.
        pid = int((pg.dir / "data" / "postmaster.pid").read_text().split()[0])
        assert os.stat(f"/proc/{pid}").st_uid != 0

        # A password is required.
        env = dict(os.environ, PGPASSWORD="wrong")
        wrong = subprocess.run(["psql", "-X", "-d", f"host={pg.socket_dir} user=herald dbname=postgres", "-c", "SELECT 1"],
                               capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr

        pg.psql("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
        pg.stop()
        with pytest.raises(RuntimeError):
            pg.psql("SELECT 1")
        pg.start()
        assert pg.psql("SELECT v FROM kept") == "7"
        pg.restart()
        assert pg.psql("SELECT count(*) FROM kept") == "1"
        directory = pg.dir
    assert not directory.exists()
