"""The programs of docs/interface.md ("Calling it from a program") and the Python examples of
README.md and clients/python/README.md, extracted from the Markdown and run against a real
daemon (Tests/reliability/herald_fixtures.py) with the toolchain they are written for.

A snippet whose toolchain is not installed (``go``, ``node``) is skipped, and pytest says which
and why; the project installs neither. Each program asks for ``device.list`` of ``alice``, so
the test registers a device for alice first and checks that the program printed it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "Tests" / "reliability"))
os.environ.setdefault("HERALD_BIN", str(REPO / ".build" / "debug" / "herald"))

from herald_fixtures import Daemon  # noqa: E402

INTERFACE = REPO / "docs" / "interface.md"
SECTION = "## Calling it from a program"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\n(.*?)^```\s*$", re.M | re.S)
# The languages the section must have a program in, and how each is run.
TOOLCHAINS = {"python": "python3", "go": "go", "js": "node"}
RUN_TIMEOUT_S = 300  # a first `go run` compiles the standard library's packages


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def snippets(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def interface_programs() -> list[tuple[str, str]]:
    return snippets(section(INTERFACE.read_text(), SECTION))


def token_hash(token: str) -> str:
    return hashlib.sha256(("push:" + token).encode()).hexdigest()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """A daemon without provider credentials (like `make run`'s): sends end skipped at once."""
    d = Daemon(transports=())
    try:
        d.register("alice", "fcm", "snippet-alice-token")
        yield d
    finally:
        d.cleanup()


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def check_lists_alice(proc: subprocess.CompletedProcess[str], what: str) -> None:
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    hashes = [d["token_hash"] for d in result["devices"]]
    assert hashes == [token_hash("snippet-alice-token")], f"{what} printed {proc.stdout!r}"


def test_the_section_has_a_program_per_language():
    languages = [lang for lang, _ in interface_programs()]
    assert sorted(languages) == sorted(TOOLCHAINS), f"{INTERFACE.name} {SECTION!r} has {languages}"


@pytest.mark.parametrize("language", sorted(TOOLCHAINS))
def test_interface_program(language, daemon, tmp_path):
    (code,) = [c for lang, c in interface_programs() if lang == language]
    tool = TOOLCHAINS[language]
    if language == "python":
        # The interpreter running the tests: python3 of the venv.
        cmd = [sys.executable, "list.py"]
        (tmp_path / "list.py").write_text(code)
    else:
        binary = shutil.which(tool)
        if binary is None:
            pytest.skip(f"{tool} is not installed: the {language} program of docs/interface.md was not run")
        name = {"go": "list.go", "js": "list.js"}[language]
        (tmp_path / name).write_text(code)
        cmd = [binary, "run", name] if language == "go" else [binary, name]
    env = dict(os.environ, HERALD_SOCKET=daemon.socket)
    if language == "go":
        # Build caches of the test's own (no HOME needed), no module download.
        env.update(GOCACHE=str(tmp_path / "gocache"), GOPATH=str(tmp_path / "gopath"), GOPROXY="off",
                   GOTOOLCHAIN="local")
    check_lists_alice(run(cmd, tmp_path, env), f"the {language} program")

    # An error answer goes to stderr with exit status 1: the same program asking an unknown app.
    if language == "python":
        wrong = code.replace('"params": {"user": "alice"}', '"params": {"user": "alice", "app": "nope"}')
    elif language == "go":
        wrong = code.replace('map[string]any{"user": "alice"}', 'map[string]any{"user": "alice", "app": "nope"}')
    else:
        wrong = code.replace('params: { user: "alice" }', 'params: { user: "alice", app: "nope" }')
    assert wrong != code, "the test's edit of the program no longer applies"
    (tmp_path / cmd[-1]).write_text(wrong)
    proc = run(cmd, tmp_path, env)
    assert proc.returncode == 1 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert "1004" in proc.stderr or "unknown_app" in proc.stderr, proc.stderr


def readme_python(path: Path, needle: str) -> str:
    matches = [c for lang, c in snippets(path.read_text()) if lang == "python" and needle in c]
    assert len(matches) == 1, f"{path}: expected one python snippet with {needle!r}, found {len(matches)}"
    return matches[0]


def test_readme_socket_snippet(daemon, tmp_path):
    """README.md's five lines on `.herald/herald.sock` (the `make run` set-up), run from a
    directory whose .herald/herald.sock is the test daemon's socket."""
    code = readme_python(REPO / "README.md", "socket.AF_UNIX")
    (tmp_path / ".herald").mkdir()
    (tmp_path / ".herald" / "herald.sock").symlink_to(daemon.socket)
    (tmp_path / "snippet.py").write_text(code)
    proc = run([sys.executable, "snippet.py"], tmp_path, dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    # It prints the whole response (a Python dict).
    assert token_hash("snippet-alice-token") in proc.stdout and "'id': 1" in proc.stdout, proc.stdout


@pytest.mark.parametrize("readme", ["README.md", "clients/python/README.md"])
def test_readme_client_library_example(readme, tmp_path):
    """The herald_client example of the README, with the package from clients/python/src, on a
    directory whose .herald/herald.sock is a daemon's socket (one of its own: it registers)."""
    code = readme_python(REPO / readme, "from herald_client import Client")
    d = Daemon(transports=())
    try:
        (tmp_path / ".herald").mkdir()
        (tmp_path / ".herald" / "herald.sock").symlink_to(d.socket)
        (tmp_path / "example.py").write_text(code)
        env = dict(os.environ, PYTHONPATH=str(REPO / "clients" / "python" / "src"))
        proc = run([sys.executable, "example.py"], tmp_path, env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "complete", proc.stdout
        assert [x["platform"] for x in d.devices("alice")] == ["fcm"]
    finally:
        d.cleanup()
