"""One run's host directories: made fresh, filled with the request's files, read back for
``fetch_files`` (never through a symlink out of them), and removed.

Request paths may name the working directory (relative, or under ``/sandbox``) or the
run's ``/tmp``, as with Sandbox Fusion.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ._isolation import SANDBOX_WORKDIR
from ._languages import TOOLCHAINS
from ._protocol import RunCodeRequest

__all__ = ["RequestError", "RunDirs", "fetch", "prepare", "remove_tree"]

logger = logging.getLogger("toolrollout.sandbox._runner")


class RequestError(Exception):
    """The request cannot be run as given (bad file path or content)."""


@dataclass(frozen=True, slots=True)
class RunDirs:
    """One run's host directories: ``root`` holds ``work`` (``/sandbox``) and ``tmp``
    (``/tmp`` under bubblewrap)."""

    root: str
    work: str
    tmp: str


def remove_tree(path: str) -> None:
    def retry(func: Callable[..., Any], target: str, _exc: object) -> None:
        # A program may leave a directory without permissions: give them back, retry.
        try:
            os.chmod(os.path.dirname(target), 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
            func(target)
        except OSError:
            logger.warning("sandbox: cannot remove %s", target)

    shutil.rmtree(path, onerror=retry)


def _inside(dirs: RunDirs, name: str) -> tuple[Path, str]:
    """The host path of ``name`` and the run directory it lies in: relative names and
    names under ``/sandbox`` are in the working directory, names under ``/tmp`` in the
    run's ``/tmp``; ``..`` and other absolute paths are refused."""
    path = PurePosixPath(name)
    base = dirs.work
    if path.is_absolute():
        for inner, host in ((SANDBOX_WORKDIR, dirs.work), ("/tmp", dirs.tmp)):
            try:
                path = path.relative_to(inner)
            except ValueError:
                continue
            base = host
            break
        else:
            raise RequestError(
                f"file path {name!r} must be relative, or under {SANDBOX_WORKDIR} or /tmp"
            )
    if ".." in path.parts or not path.parts:
        raise RequestError(f"file path {name!r} must stay inside the sandbox's directories")
    return Path(base, *path.parts), base


def prepare(request: RunCodeRequest, uid: int, work_root: str | None) -> RunDirs:
    """Make a run's directories under ``work_root`` and write the request's source and
    ``files`` there (owned by ``uid`` when it is one, >= 0)."""
    root = tempfile.mkdtemp(prefix="toolrollout-sandbox-", dir=work_root)
    dirs = RunDirs(root=root, work=os.path.join(root, "work"), tmp=os.path.join(root, "tmp"))
    try:
        os.mkdir(dirs.work, 0o700)
        os.mkdir(dirs.tmp, 0o700)
        _write_files(dirs, request.code, request.language, request.files)
        if uid >= 0:
            # bwrap enters them as a capability-less root before the launcher switches
            # to the slot uid: it needs the search bit.
            for top in (root, dirs.work, dirs.tmp):
                os.chmod(top, 0o711)
            for top in (dirs.work, dirs.tmp):
                for parent, subdirs, names in os.walk(top):
                    os.chown(parent, uid, uid)
                    for entry in (*subdirs, *names):
                        os.chown(os.path.join(parent, entry), uid, uid, follow_symlinks=False)
    except BaseException:
        remove_tree(root)
        raise
    return dirs


def _write_files(dirs: RunDirs, code: str, language: str, files: Mapping[str, str | None]) -> None:
    for name, content in files.items():
        if not isinstance(content, str):
            continue  # Sandbox Fusion skips null contents too
        target, _ = _inside(dirs, name)
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"file {name!r}: content is not valid base64") from None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    source = TOOLCHAINS[language].source
    Path(dirs.work, source).write_text(code, encoding="utf-8")


def fetch(dirs: RunDirs, names: list[str], limit: int) -> tuple[dict[str, str], list[str]]:
    """The files asked for, base64-encoded, and a note for each one left out for a
    reason other than not existing (Sandbox Fusion leaves missing ones out silently)."""
    files: dict[str, str] = {}
    notes: list[str] = []
    for name in names:
        try:
            target, base = _inside(dirs, name)
        except RequestError as exc:
            notes.append(f"fetch_files: {exc}")
            continue
        # The program controls the directory: refuse symlinks out of it (the server may
        # be root and would otherwise read any host file for it).
        root = os.path.realpath(base)
        parent = os.path.realpath(target.parent)
        if parent != root and not parent.startswith(root + os.sep):
            notes.append(f"fetch_files: {name!r} is reached through a symlink: left out")
            continue
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # missing: left out, as Sandbox Fusion does
        except OSError as exc:
            kind = "a symlink" if os.path.islink(target) else exc.strerror
            notes.append(f"fetch_files: {name!r} cannot be read ({kind}): left out")
            continue
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                notes.append(f"fetch_files: {name!r} is not a regular file: left out")
                continue
            data = handle.read(limit + 1) if info.st_size <= limit else b""
        if info.st_size > limit or len(data) > limit:
            notes.append(
                f"fetch_files: {name!r} is over the {limit} byte limit (max_fetch_bytes): left out"
            )
            continue
        files[name] = base64.b64encode(data).decode("ascii")
    return files, notes
