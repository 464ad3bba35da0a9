"""``pip install`` of clients/python into a fresh venv with no package index (pip's default
build isolation included), then a call to a real daemon with the installed package, not this
tree's src/. The same for the sdist the build backend makes, and for an editable install."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1]

PROGRAM = """
import json, pathlib, sys
import herald_client
from herald_client import Client, UnknownApp
here = pathlib.Path(herald_client.__file__).parent
with Client(sys.argv[1]) as herald:
    health = herald.system_health()
    try:
        herald.device_list(user="x", app="no-such-app")
        raised = None
    except UnknownApp as e:
        raised = e.code
print(json.dumps({"file": str(here), "typed": (here / "py.typed").is_file(), "health": health["status"],
                  "raised": raised, "version": herald_client.__version__}))
"""


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    # No index and no network: an install that needed to fetch anything fails.
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1",
               PYTHONDONTWRITEBYTECODE="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9")
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv of the interpreter running the tests: pip (and whatever ensurepip brings)
    and nothing else. Each test leaves it without herald-client."""
    path = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=offline_env(),
                          timeout=300)
    assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_program(python: Path, socket_path: str, cwd: Path) -> dict:
    out = subprocess.run([str(python), "-c", PROGRAM, socket_path], capture_output=True, text=True, cwd=cwd,
                         env=offline_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def uninstall(python: Path, cwd: Path) -> None:
    pip(python, "uninstall", "-y", "herald-client")
    gone = subprocess.run([str(python), "-c", "import herald_client"], capture_output=True, cwd=cwd,
                          env=offline_env())
    assert gone.returncode != 0, "herald_client still imports after pip uninstall"


def test_pip_installs_the_package_offline_into_a_fresh_venv(daemon, venv, tmp_path):
    python = venv / "bin" / "python"
    pip(python, "install", str(PACKAGE))
    shown = pip(python, "show", "--files", "herald-client")
    assert "Name: herald-client" in shown.stdout and "herald_client/py.typed" in shown.stdout, shown.stdout
    # Run from tmp_path with no PYTHONPATH: the import can only find the installed copy.
    info = run_program(python, daemon.socket, tmp_path)
    assert Path(info["file"]).is_relative_to(venv), info
    assert info["typed"] is True and info["health"] == "ok" and info["raised"] == 1004, info
    uninstall(python, tmp_path)


def test_the_sdist_and_the_wheel_of_the_backend(daemon, venv, tmp_path):
    sys.path.insert(0, str(PACKAGE / "_backend"))
    try:
        backend = importlib.import_module("herald_client_build")
    finally:
        sys.path.remove(str(PACKAGE / "_backend"))
    (tmp_path / "dist").mkdir()
    wheel_name = backend.build_wheel(str(tmp_path / "dist"))
    with zipfile.ZipFile(tmp_path / "dist" / wheel_name) as wheel:
        names = set(wheel.namelist())
        record = wheel.read("herald_client-0.1.0.dist-info/RECORD").decode()
        metadata = wheel.read("herald_client-0.1.0.dist-info/METADATA").decode()
    sources = {p.relative_to(PACKAGE / "src").as_posix() for p in (PACKAGE / "src").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert sources <= names and "herald_client/py.typed" in sources, names
    assert all(name in record for name in names), record
    assert "Name: herald-client\n" in metadata and "Requires-Python: >=3.11\n" in metadata

    sdist_name = backend.build_sdist(str(tmp_path / "dist"))
    with tarfile.open(tmp_path / "dist" / sdist_name) as sdist:
        members = set(sdist.getnames())
    assert {"herald_client-0.1.0/pyproject.toml", "herald_client-0.1.0/PKG-INFO",
            "herald_client-0.1.0/_backend/herald_client_build.py",
            "herald_client-0.1.0/src/herald_client/client.py"} <= members, members

    python = venv / "bin" / "python"
    pip(python, "install", str(tmp_path / "dist" / sdist_name))
    info = run_program(python, daemon.socket, tmp_path)
    assert Path(info["file"]).is_relative_to(venv) and info["health"] == "ok", info
    uninstall(python, tmp_path)


def test_an_editable_install_imports_this_tree(daemon, venv, tmp_path):
    python = venv / "bin" / "python"
    pip(python, "install", "-e", str(PACKAGE))
    info = run_program(python, daemon.socket, tmp_path)
    assert Path(info["file"]) == PACKAGE / "src" / "herald_client", info
    assert info["typed"] is True and info["health"] == "ok", info
    uninstall(python, tmp_path)
