"""How one program is started: the bubblewrap command line and the in-sandbox launcher.

As root, bwrap runs without a user namespace and the launcher drops to a per-slot uid; as
a normal user, bwrap maps the program to 65534 in a new user namespace. Why, and what both
modes show the program: docs/sandbox.md ("Who the program runs as" and the isolation table).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from toolrollout._exceptions import SandboxIsolationError

__all__ = [
    "SANDBOX_WORKDIR",
    "BwrapInfo",
    "Limits",
    "bwrap_argv",
    "find_bwrap",
    "interpreter_prefixes",
    "launcher_argv",
    "probe_bwrap",
]

SANDBOX_WORKDIR = "/sandbox"
"""The program's working directory inside the sandbox (a per-run host directory)."""

NOBODY = 65534

_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/ssl/openssl.cnf",
)
"""The only parts of ``/etc`` a program sees: the dynamic linker's configuration, the
alternatives, the time zone and OpenSSL's configuration (Node.js needs it). No network,
so no passwd, hosts or certificates."""

_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Runs inside the sandbox with ``python -I -S``: set the limits, drop to the slot uid if
# asked (as root), then become the program.
# argv: AS DATA CPU NPROC FSIZE NOFILE UID -- CMD...
_LAUNCHER = """\
import os, resource, sys
a = sys.argv[1:]
mem, data, cpu, nproc, fsize, nofile, uid = (int(x) for x in a[:7])
cmd = a[8:]
inf = resource.RLIM_INFINITY
resource.setrlimit(resource.RLIMIT_AS, (mem, mem) if mem > 0 else (inf, inf))
resource.setrlimit(resource.RLIMIT_DATA, (data, data) if data > 0 else (inf, inf))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.umask(0o022)
try:
    os.execv(cmd[0], cmd)
except OSError as e:
    sys.stderr.write(f"sandbox: cannot start {cmd[0]}: {e}\\n")
    sys.exit(127)
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The resource limits of one run, as the launcher applies them."""

    memory_bytes: int
    """RLIMIT_AS (address space); <= 0: unlimited."""
    data_bytes: int = 0
    """RLIMIT_DATA (writable private memory); <= 0: unlimited."""
    cpu_seconds: int
    """RLIMIT_CPU soft limit (SIGXCPU), the hard limit one second later (SIGKILL)."""
    processes: int
    """RLIMIT_NPROC: processes and threads of the sandbox's uid."""
    file_size_bytes: int
    """RLIMIT_FSIZE: the largest file the program may write (SIGXFSZ beyond)."""
    open_files: int = 256
    """RLIMIT_NOFILE."""


@dataclass(frozen=True, slots=True)
class BwrapInfo:
    """A bubblewrap binary and the options it supports."""

    path: str
    version: str
    privileged: bool
    """Whether it runs as root (no user namespace; the launcher drops to a slot uid)."""
    supports_size: bool
    """``--size`` (bubblewrap >= 0.7): size-limited tmpfs."""
    supports_perms: bool
    """``--perms`` (bubblewrap >= 0.5)."""
    supports_disable_userns: bool
    """``--disable-userns`` (bubblewrap >= 0.8)."""


def find_bwrap(path: str | None = None) -> str | None:
    """The ``bwrap`` executable on ``path`` (default: ``$PATH``), or None."""
    return shutil.which("bwrap", path=path)


def probe_bwrap(bwrap: str) -> BwrapInfo:
    """Ask ``bwrap`` for its version and options (runs it twice, briefly)."""
    try:
        version = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
        usage = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxIsolationError(f"cannot run bubblewrap at {bwrap}: {exc}") from exc
    text = usage.stdout + usage.stderr
    return BwrapInfo(
        path=bwrap,
        version=version.removeprefix("bubblewrap ").strip() or "unknown",
        privileged=os.geteuid() == 0,
        supports_size="--size" in text,
        supports_perms="--perms" in text,
        supports_disable_userns="--disable-userns" in text,
    )


@cache
def interpreter_prefixes(python: str) -> tuple[str, ...]:
    """Directories a program needs read access to for ``python`` to start: its prefix,
    base prefix and the folder of its executable, each resolved, outside ``/usr``."""
    try:
        out = subprocess.run(
            # Without -S: a virtualenv's prefix is set by the site module.
            [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxIsolationError(f"cannot run the sandbox interpreter {python}: {exc}") from exc
    candidates = [line for line in out[:2] if line.strip()]
    candidates.append(str(Path(python).parent))
    prefixes: list[str] = []
    for candidate in candidates:
        for path in {candidate, os.path.realpath(candidate)}:
            if path != "/usr" and not path.startswith("/usr/") and path not in prefixes:
                prefixes.append(path)
    return tuple(prefixes)


def launcher_argv(python: str, limits: Limits, uid: int, command: Sequence[str]) -> list[str]:
    """``python -I -S -c LAUNCHER ...``: apply ``limits``, switch to ``uid`` (when >= 0),
    then ``exec`` ``command``."""
    return [
        python,
        "-I",
        "-S",
        "-c",
        _LAUNCHER,
        str(limits.memory_bytes),
        str(limits.data_bytes),
        str(limits.cpu_seconds),
        str(limits.processes),
        str(limits.file_size_bytes),
        str(limits.open_files),
        str(uid),
        "--",
        *command,
    ]


def _open_dir(info: BwrapInfo, folder: str) -> list[str]:
    """Make ``folder`` in the sandbox with mode 0755."""
    if info.supports_perms:
        return ["--perms", "0755", "--dir", folder]
    return ["--dir", folder, "--chmod", "0755", folder]


def _read_only_binds(info: BwrapInfo, read_only: Sequence[str]) -> list[str]:
    """Bind each path read-only, its parents made 0755 first: mount points' parents would
    be made mode 0700 (root's) and unreadable to the program's uid."""
    argv: list[str] = []
    made: set[str] = set()
    for path in read_only:
        for parent in reversed(Path(path).parents[:-1]):
            ancestor = str(parent)
            if ancestor in made or ancestor in ("/usr", "/etc", "/tmp") or os.path.islink(ancestor):
                continue
            made.add(ancestor)
            argv += _open_dir(info, ancestor)
        argv += ["--ro-bind", path, path]
    return argv


def bwrap_argv(
    info: BwrapInfo,
    *,
    workdir: str,
    read_only: Sequence[str],
    tmp_size_bytes: int,
    command: Sequence[str],
    seccomp_fd: int | None = None,
    tmp_dir: str | None = None,
) -> list[str]:
    """The bubblewrap command line running ``command`` with ``workdir`` as ``/sandbox`` and
    ``tmp_dir`` as ``/tmp`` (None: a tmpfs of ``tmp_size_bytes``, as ``/dev/shm`` always)."""
    argv = [
        info.path,
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    if info.privileged:
        # No user namespace (it would map the program to uid 0 outside, which RLIMIT_NPROC
        # ignores); keep only what the launcher needs to drop to the slot uid.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
        if info.supports_disable_userns:
            argv.append("--disable-userns")
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in _ROOT_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    # /etc is made by bwrap (mode 0700 when it runs as root): open it to the program's uid,
    # which follows the alternatives symlinks of /usr/bin (javac, cc) through it.
    for folder in ("/etc", "/etc/ssl"):
        argv += _open_dir(info, folder)
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_dir is not None:
        argv += ["--bind", tmp_dir, "/tmp"]
    for mount in ("/dev/shm",) if tmp_dir is not None else ("/tmp", "/dev/shm"):
        if info.supports_perms:
            argv += ["--perms", "1777"]
        if info.supports_size:
            argv += ["--size", str(tmp_size_bytes)]
        argv += ["--tmpfs", mount]
        if not info.supports_perms:
            argv += ["--chmod", "1777", mount]
    # After /tmp is mounted, so a read-only path under /tmp (a checkout or a runtime there)
    # is bound over the private /tmp instead of hidden by it.
    argv += _read_only_binds(info, read_only)
    argv += ["--bind", workdir, SANDBOX_WORKDIR, "--chdir", SANDBOX_WORKDIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--", *command]
    return argv


def default_interpreter() -> str:
    """The server's own interpreter, resolved past any virtualenv symlink."""
    return os.path.realpath(sys.executable)
