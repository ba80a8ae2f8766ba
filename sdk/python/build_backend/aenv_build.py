"""A PEP 517/660 build backend in the standard library only.

Why not setuptools: `pip install ./sdk/python` must work offline. With
build isolation pip would download setuptools; without it, the setuptools
found on many machines (e.g. 65.x without the separate `wheel` package)
cannot build wheels. This backend needs nothing: it zips src/aenv into a
wheel, with metadata taken from pyproject.toml's [project] table.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "aenv"


def _project() -> Dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _metadata(project: Dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3.11')}",
    ]
    license_text = project.get("license", {}).get("text")
    if license_text:
        lines.append(f"License: {license_text}")
    readme = os.path.join(ROOT, project.get("readme", "README.md"))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _dist_info(project: Dict) -> str:
    return f"{project['name']}-{project['version']}.dist-info"


def _wheel_name(project: Dict) -> str:
    return f"{project['name']}-{project['version']}-py3-none-any.whl"


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(path: str, files: List[Tuple[str, bytes]], project: Dict) -> None:
    info = _dist_info(project)
    files = files + [
        (f"{info}/METADATA", _metadata(project).encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: aenv_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in files)
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files + [(f"{info}/RECORD", record.encode())]:
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)


def _package_files() -> List[Tuple[str, bytes]]:
    src = os.path.join(ROOT, "src")
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(src, PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py") or name == "py.typed":
                full = os.path.join(dirpath, name)
                with open(full, "rb") as f:
                    out.append((os.path.relpath(full, src).replace(os.sep, "/"), f.read()))
    return out


def get_requires_for_build_wheel(config_settings: Optional[Dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict] = None,
                metadata_directory: Optional[str] = None) -> str:
    project = _project()
    name = _wheel_name(project)
    _write_wheel(os.path.join(wheel_directory, name), _package_files(), project)
    return name


def build_editable(wheel_directory: str, config_settings: Optional[Dict] = None,
                   metadata_directory: Optional[str] = None) -> str:
    # PEP 660: a .pth file puts src/ on sys.path, so edits show at once.
    project = _project()
    name = _wheel_name(project)
    pth = (os.path.join(ROOT, "src") + "\n").encode()
    _write_wheel(os.path.join(wheel_directory, name), [(f"_{PACKAGE}_editable.pth", pth)], project)
    return name


def build_sdist(sdist_directory: str, config_settings: Optional[Dict] = None) -> str:
    project = _project()
    base = f"{project['name']}-{project['version']}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/aenv_build.py"]:
            tar.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        for rel, data in _package_files():
            entry = tarfile.TarInfo(f"{base}/src/{rel}")
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
        pkg_info = _metadata(project).encode()
        entry = tarfile.TarInfo(f"{base}/PKG-INFO")
        entry.size = len(pkg_info)
        tar.addfile(entry, io.BytesIO(pkg_info))
    return name
