"""The PEP 517 / PEP 660 build backend of herald-client: standard library only.

Why not setuptools: building a wheel with the setuptools a fresh venv has (65/66 on Python
3.11) needs the ``wheel`` package, which such a venv lacks, so ``pip install`` would have to
fetch it. This backend needs nothing (``requires = []``): pip installs the package from a
checkout with no network, with or without build isolation.

It reads ``[project]`` of pyproject.toml and packs ``src/herald_client`` (every file but
caches) into a ``py3-none-any`` wheel; ``build_editable`` makes a wheel whose .pth file
points at ``src``; ``build_sdist`` packs what a wheel is built from.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "herald_client"
SOURCE = ROOT / "src" / PACKAGE
# Fixed times, so the same tree builds the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
TAR_TIME = 315532800


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _dist_name() -> str:
    return str(_project()["name"]).replace("-", "_")


def _version() -> str:
    return str(_project()["version"])


def _metadata() -> bytes:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
    ]
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    body = ""
    if "readme" in project:
        lines.append("Description-Content-Type: text/markdown")
        body = (ROOT / project["readme"]).read_text(encoding="utf-8")
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _package_files() -> list[Path]:
    return sorted(
        p for p in SOURCE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    )


def _dist_info() -> str:
    return f"{_dist_name()}-{_version()}.dist-info"


class _Wheel:
    """A wheel being written: each file's hash and size go into RECORD."""

    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self._record: list[str] = []

    def add(self, name: str, data: bytes) -> None:
        info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self._zip.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        self._record.append(f"{name},sha256={digest},{len(data)}")

    def close(self) -> None:
        dist_info = _dist_info()
        self.add(f"{dist_info}/METADATA", _metadata())
        wheel = "Wheel-Version: 1.0\nGenerator: herald_client_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        self.add(f"{dist_info}/WHEEL", wheel.encode())
        record = "\n".join(self._record + [f"{dist_info}/RECORD,,"]) + "\n"
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=ZIP_TIME)
        info.external_attr = 0o644 << 16
        self._zip.writestr(info, record)
        self._zip.close()


def _wheel_name() -> str:
    return f"{_dist_name()}-{_version()}-py3-none-any.whl"


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    name = _wheel_name()
    wheel = _Wheel(Path(wheel_directory) / name)
    for path in _package_files():
        wheel.add(path.relative_to(ROOT / "src").as_posix(), path.read_bytes())
    wheel.close()
    return name


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    name = _wheel_name()
    wheel = _Wheel(Path(wheel_directory) / name)
    wheel.add(f"{_dist_name()}.pth", (str(ROOT / "src") + "\n").encode())
    wheel.close()
    return name


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    base = f"{_dist_name()}-{_version()}"
    name = f"{base}.tar.gz"
    files = [ROOT / "pyproject.toml", ROOT / "README.md", *_package_files(), Path(__file__).resolve()]
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:

        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{base}/{arcname}")
            info.size, info.mtime, info.mode = len(data), TAR_TIME, 0o644
            tar.addfile(info, io.BytesIO(data))

        add("PKG-INFO", _metadata())
        for path in files:
            add(path.relative_to(ROOT).as_posix(), path.read_bytes())
    return name


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


__all__ = [
    "build_wheel",
    "build_editable",
    "build_sdist",
    "get_requires_for_build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
]
