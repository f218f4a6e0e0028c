"""Runs one ``/run_code`` request on this machine: compiled (when the language is) and run,
isolated, bounded.

Each run gets fresh host directories for its working directory (``/sandbox``) and its
``/tmp``; the compile and run steps are two sandboxed processes over them, and a failed
compile skips the run, as in Sandbox Fusion. Blocking work runs off the event loop.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.to_thread

from toolrollout._exceptions import SandboxIsolationError, UserError

from ._isolation import (
    SANDBOX_WORKDIR,
    BwrapInfo,
    Limits,
    bwrap_argv,
    default_interpreter,
    find_bwrap,
    interpreter_prefixes,
    launcher_argv,
    probe_bwrap,
)
from ._languages import SEARCH_PATH, TOOLCHAINS, Toolchain, resolve_program, support_paths
from ._process import execute, wait_uid_gone
from ._protocol import (
    CommandRunResult,
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunStatus,
    parse_run_status,
)
from ._rundir import RequestError, RunDirs, fetch, prepare, remove_tree
from ._seccomp import userns_filter

__all__ = ["SUPPORTED_LANGUAGES", "SandboxRunner", "SandboxServerConfig"]

logger = logging.getLogger(__name__)

SUPPORTED_LANGUAGES: tuple[str, ...] = tuple(TOOLCHAINS)
"""The languages the local sandbox runs when their toolchain is installed
(:attr:`SandboxRunner.languages`: those installed here)."""

NOT_INSTALLED_EXIT = 127
"""Return code of a language whose toolchain is not installed (a shell's "command not
found", which is what Sandbox Fusion answers then)."""

_MB = 1024 * 1024
_MAX_UID_SLOTS = 1024


@dataclass(frozen=True, kw_only=True)
class SandboxServerConfig:
    """Settings of the local sandbox (``toolrollout sandbox serve``)."""

    max_concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Programs running at once; further requests wait for a slot."""
    isolation: Literal["bwrap", "none"] = "bwrap"
    """``"none"`` runs programs without any isolation (``--unsafe-no-isolation``)."""
    bwrap: str | None = None
    """Path of ``bwrap``; None: found on ``$PATH``."""
    python: str = field(default_factory=default_interpreter)
    """Interpreter that runs ``python`` code (default: the server's, without its venv)."""
    bash: str = "/bin/bash"
    """Shell that runs ``bash`` code."""
    memory_limit_mb: int = 1024
    """Memory limit per process, and the cap (and -1 default) of a request's
    ``memory_limit_MB`` (see ``Toolchain.address_space_limit``)."""
    compile_memory_limit_mb: int = 2048
    """RLIMIT_DATA of a compile step (compilers are not the program under test)."""
    max_run_timeout: float = 300.0
    """Cap on a request's ``run_timeout`` (seconds)."""
    max_processes: int = 64
    """Processes and threads per run (RLIMIT_NPROC; see the module docs of _isolation)."""
    max_file_size_mb: int = 64
    """Largest file a program may write (RLIMIT_FSIZE)."""
    max_output_bytes: int = 128 * 1024
    """Bytes of stdout and of stderr kept per run; the rest is dropped with a marker."""
    tmp_size_mb: int = 256
    """Size of the private ``/tmp`` (and of ``/dev/shm``) tmpfs under bubblewrap."""
    max_fetch_bytes: int = 16 * _MB
    """Largest file returned through ``fetch_files`` (larger ones are left out)."""
    uid_base: int = 60000
    """As root, programs run as ``uid_base + slot`` (so RLIMIT_NPROC is per run)."""
    work_root: str | None = None
    """Where per-run working directories are made (default: the system temp dir)."""
    read_only_paths: tuple[str, ...] = ()
    """Extra host paths made visible read-only (e.g. a data set, an interpreter's libs)."""
    programs: Mapping[str, str] = field(default_factory=dict)
    """Toolchain programs by name (``tsx``, ``go``...): a path, or a name on
    :data:`SEARCH_PATH` (where unnamed ones are looked up)."""

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise UserError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.isolation not in ("bwrap", "none"):
            raise UserError(f"isolation must be 'bwrap' or 'none', got {self.isolation!r}")
        for name in (
            "memory_limit_mb",
            "compile_memory_limit_mb",
            "max_processes",
            "max_file_size_mb",
            "tmp_size_mb",
        ):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_output_bytes < 0 or self.max_fetch_bytes < 0:
            raise UserError("max_output_bytes and max_fetch_bytes must be >= 0")
        if not (self.max_run_timeout > 0 and math.isfinite(self.max_run_timeout)):
            raise UserError(
                f"max_run_timeout must be a positive number, got {self.max_run_timeout}"
            )


@dataclass(frozen=True, slots=True)
class _Installed:
    """A language whose programs were found: its commands with the programs filled in."""

    toolchain: Toolchain
    programs: Mapping[str, str]


class SandboxRunner:
    """Runs ``/run_code`` requests under :class:`SandboxServerConfig`; construction finds
    the toolchains and checks the isolation works (else SandboxIsolationError)."""

    def __init__(self, config: SandboxServerConfig | None = None) -> None:
        self.config = config if config is not None else SandboxServerConfig()
        self._bwrap: BwrapInfo | None = None
        self._read_only: tuple[str, ...] = ()
        self._seccomp: bytes | None = None
        self._installed = self._find_toolchains()
        if self.config.isolation == "bwrap":
            self._bwrap = self._find_bwrap()
            self._read_only = self._visible_paths()
            self._seccomp = userns_filter()
        root = os.geteuid() == 0
        self._drop_uid = root and self._bwrap is not None
        if self._drop_uid and self.config.max_concurrency > _MAX_UID_SLOTS:
            raise UserError(
                f"max_concurrency must be <= {_MAX_UID_SLOTS} when running as root "
                "(one uid per concurrent run)"
            )
        count = self.config.max_concurrency if self._drop_uid else 0
        # A queue: a released uid goes to the back, so the uid of a run that was just
        # killed is reused last, after its processes are surely gone.
        self._free_uids = deque(self.config.uid_base + i for i in range(count))
        self._limiter = anyio.CapacityLimiter(self.config.max_concurrency)
        self.runs = 0
        """Requests run since start."""
        self._check()

    @property
    def isolation(self) -> str:
        """``"bwrap"`` or ``"none"``."""
        return "bwrap" if self._bwrap is not None else "none"

    @property
    def running(self) -> int:
        """Programs running now."""
        return int(self._limiter.borrowed_tokens)

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages whose toolchain is installed here (python and bash always)."""
        return tuple(self._installed)

    def describe(self) -> dict[str, Any]:
        """What ``GET /server_info`` reports (behind the API key: it describes the host)."""
        info: dict[str, Any] = {
            "status": "ok",
            "isolation": self.isolation,
            "languages": list(self.languages),
            "not_installed": [name for name in TOOLCHAINS if name not in self._installed],
            "python": self.config.python,
            "max_concurrency": self.config.max_concurrency,
            "running": self.running,
            "runs": self.runs,
        }
        if self._bwrap is not None:
            info["bwrap_version"] = self._bwrap.version
            info["privileged"] = self._bwrap.privileged
            info["seccomp"] = self._seccomp is not None
        return info

    def _find_toolchains(self) -> dict[str, _Installed]:
        configured = {"python": self.config.python, "bash": self.config.bash}
        configured.update(self.config.programs)
        unknown = set(self.config.programs) - {p for t in TOOLCHAINS.values() for p in t.programs}
        if unknown:
            raise UserError(f"unknown sandbox program(s): {', '.join(sorted(unknown))}")
        installed: dict[str, _Installed] = {}
        for name, toolchain in TOOLCHAINS.items():
            wanted = ("python", "bash") if name in ("python", "bash") else toolchain.programs
            found = {program: resolve_program(program, configured) for program in wanted}
            missing = [program for program, path in found.items() if path is None]
            if missing:
                if name in ("python", "bash"):
                    raise UserError(f"the sandbox's {name} ({configured[name]}) is not executable")
                named = [p for p in missing if p in self.config.programs]
                if named:  # asked for by name: a typo must not pass as "not installed"
                    raise UserError(
                        f"sandbox program {named[0]}={self.config.programs[named[0]]} is not "
                        "an executable"
                    )
                logger.info("sandbox: %s not installed (no %s)", name, ", ".join(missing))
                continue
            installed[name] = _Installed(toolchain, {k: v for k, v in found.items() if v})
        return installed

    def _find_bwrap(self) -> BwrapInfo:
        wanted = self.config.bwrap
        path = find_bwrap() if wanted is None else shutil.which(wanted)
        if path is None:
            where = "on PATH" if wanted is None else f"at {wanted}"
            raise SandboxIsolationError(
                f"bubblewrap (bwrap) was not found {where}: install it (apt-get install "
                "bubblewrap) or pass --unsafe-no-isolation to run code without any isolation"
            )
        return probe_bwrap(path)

    def _visible_paths(self) -> tuple[str, ...]:
        paths = list(interpreter_prefixes(self.config.python))
        for name, installed in self._installed.items():
            if name == "python":
                continue
            for program in installed.programs.values():
                paths.extend(support_paths(program))
        for extra in self.config.read_only_paths:
            resolved = os.path.realpath(extra)
            if not os.path.exists(resolved):
                raise UserError(f"read-only path {extra} does not exist")
            paths.append(resolved)
        return tuple(dict.fromkeys(paths))

    def _limits(self, seconds: float, memory_mb: int, toolchain: Toolchain) -> Limits:
        memory = memory_mb * _MB
        return Limits(
            memory_bytes=memory if toolchain.address_space_limit else 0,
            data_bytes=0 if toolchain.address_space_limit else memory,
            cpu_seconds=max(1, math.ceil(seconds)) + 1,
            processes=self.config.max_processes,
            file_size_bytes=self.config.max_file_size_mb * _MB,
        )

    def _command(
        self,
        installed: _Installed,
        template: tuple[str, ...],
        files: Mapping[str, str | None],
        memory_mb: int,
    ) -> list[str]:
        jars = [name for name in files if name.endswith(".jar")]
        values = {
            "source": installed.toolchain.source,
            "classpath": ":".join([".", *jars]),
            "heap_mb": str(max(16, memory_mb // 2)),
            **installed.programs,
        }
        return [part.format_map(values) for part in template]

    def _argv(
        self, dirs: RunDirs, command: list[str], limits: Limits, uid: int
    ) -> tuple[list[str], int | None]:
        """The command line, and the file descriptor it needs passed (the seccomp filter;
        the caller closes it once the process started)."""
        launched = launcher_argv(self.config.python, limits, uid, command)
        if self._bwrap is None:
            return launched, None
        seccomp_fd = None
        if self._seccomp is not None:
            seccomp_fd = os.memfd_create("toolrollout-seccomp", os.MFD_CLOEXEC)
            os.write(seccomp_fd, self._seccomp)
            os.lseek(seccomp_fd, 0, os.SEEK_SET)
        argv = bwrap_argv(
            self._bwrap,
            workdir=dirs.work,
            read_only=self._read_only,
            tmp_size_bytes=self.config.tmp_size_mb * _MB,
            command=launched,
            seccomp_fd=seccomp_fd,
            tmp_dir=dirs.tmp,
        )
        return argv, seccomp_fd

    def _env(self, dirs: RunDirs, extra: Mapping[str, str]) -> dict[str, str]:
        isolated = self._bwrap is not None
        inner_dir = SANDBOX_WORKDIR if isolated else dirs.work
        inner_tmp = "/tmp" if isolated else dirs.tmp
        python_bin = os.path.dirname(self.config.python)
        env = {
            "PATH": f"{python_bin}:{SEARCH_PATH}",
            "HOME": inner_dir,
            "TMPDIR": inner_tmp,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for key, value in extra.items():
            env[key] = value if isolated else value.replace("/tmp", inner_tmp, 1)
        return env

    def _check(self) -> None:
        """Run ``print(1+1)`` once, synchronously, to prove the setup works."""
        uid = self._free_uids[0] if self._free_uids else -1
        python = self._installed["python"]
        dirs = prepare(
            RunCodeRequest(code="print(1 + 1)", language="python"), uid, self.config.work_root
        )
        try:
            command = self._command(python, python.toolchain.run, {}, 256)
            argv, fd = self._argv(dirs, command, self._limits(30, 256, python.toolchain), uid)
            try:
                done = subprocess.run(
                    argv,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    cwd=dirs.work,
                    env=self._env(dirs, {}),
                    start_new_session=True,
                    pass_fds=() if fd is None else (fd,),
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxIsolationError(f"the sandbox cannot start a program: {exc}") from exc
            finally:
                if fd is not None:
                    os.close(fd)
            if done.returncode != 0 or done.stdout.strip() != "2":
                detail = (done.stderr.strip() or done.stdout.strip()).splitlines()
                why = detail[-1] if detail else f"exit status {done.returncode}"
                hint = ""
                if self._bwrap is not None:
                    hint = (
                        " (bubblewrap needs user namespaces, or root; pass "
                        "--unsafe-no-isolation to run without isolation)"
                    )
                raise SandboxIsolationError(f"the sandbox cannot run python here: {why}{hint}")
        finally:
            remove_tree(dirs.root)

    # --- per run ----------------------------------------------------------------------

    async def run(self, request: RunCodeRequest) -> RunCodeResponse:
        """Run one request; sandbox-side failures come back as ``SandboxError``."""
        installed = self._installed.get(request.language)
        if installed is None:
            return self._not_installed(request.language)
        async with self._limiter:
            uid = self._free_uids.popleft() if self._drop_uid else -1
            try:
                self.runs += 1
                return await self._run_in_slot(request, installed, uid)
            finally:
                if self._drop_uid:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(wait_uid_gone, uid, 2.0)
                    self._free_uids.append(uid)

    def _not_installed(self, language: str) -> RunCodeResponse:
        """Sandbox Fusion's answer for a missing toolchain: exit 127, status Failed (not a
        SandboxError, which clients retry)."""
        toolchain = TOOLCHAINS.get(language)
        if toolchain is None:
            why = f"language {language!r} is not supported by this sandbox"
        else:
            why = f"the {language} toolchain ({', '.join(toolchain.programs)}) is not installed"
        stderr = (
            f"sandbox: {why}; installed here: {', '.join(self.languages)} "
            "(docs/sandbox.md lists the packages)\n"
        )
        result = CommandRunResult(
            status=CommandRunStatus.Finished,
            execution_time=0.0,
            return_code=NOT_INSTALLED_EXIT,
            stdout="",
            stderr=stderr,
        )
        compiled = toolchain is not None and toolchain.compile is not None
        return RunCodeResponse(
            status=RunStatus.Failed,
            message="",
            compile_result=result if compiled else None,
            run_result=None if compiled else result,
        )

    async def _run_in_slot(
        self, request: RunCodeRequest, installed: _Installed, uid: int
    ) -> RunCodeResponse:
        try:
            dirs = await anyio.to_thread.run_sync(prepare, request, uid, self.config.work_root)
        except RequestError as exc:
            return RunCodeResponse(status=RunStatus.SandboxError, message=str(exc))
        toolchain = installed.toolchain
        compile_result: CommandRunResult | None = None
        run_result: CommandRunResult | None = None
        files: dict[str, str] = {}
        notes: list[str] = []
        try:
            cap = self.config.max_run_timeout
            memory = self.config.memory_limit_mb
            if request.memory_limit_MB > 0:
                memory = min(memory, request.memory_limit_MB)
            if toolchain.compile is not None:
                seconds = min(max(request.compile_timeout, 0.0), cap)
                limits = self._limits(seconds, self.config.compile_memory_limit_mb, toolchain)
                command = self._command(
                    installed, toolchain.compile, request.files, self.config.compile_memory_limit_mb
                )
                env = {**toolchain.env, **toolchain.compile_env}
                argv, fd = self._argv(dirs, command, limits, uid)
                compile_result = await self._execute(argv, fd, dirs, env, None, seconds)
            compiled = compile_result is None or (
                compile_result.status == CommandRunStatus.Finished
                and compile_result.return_code == 0
            )
            if compiled:
                seconds = min(max(request.run_timeout, 0.0), cap)
                limits = self._limits(seconds, memory, toolchain)
                command = self._command(installed, toolchain.run, request.files, memory)
                argv, fd = self._argv(dirs, command, limits, uid)
                run_result = await self._execute(
                    argv, fd, dirs, toolchain.env, request.stdin, seconds
                )
            if request.fetch_files:
                files, notes = await anyio.to_thread.run_sync(
                    fetch, dirs, request.fetch_files, self.config.max_fetch_bytes
                )
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_tree, dirs.root)
        status, message = parse_run_status(compile_result, run_result)
        if notes:
            for note in notes:
                logger.warning("sandbox: %s", note)
            message = "; ".join(filter(None, [message, *notes]))
        return RunCodeResponse(
            status=status,
            message=message,
            compile_result=compile_result,
            run_result=run_result,
            files=files,
        )

    async def _execute(
        self,
        argv: list[str],
        pass_fd: int | None,
        dirs: RunDirs,
        extra_env: Mapping[str, str],
        stdin: str | None,
        run_timeout: float,
    ) -> CommandRunResult:
        return await execute(
            argv,
            pass_fd=pass_fd,
            cwd=dirs.work,
            env=self._env(dirs, extra_env),
            stdin=stdin,
            run_timeout=run_timeout,
            max_output_bytes=self.config.max_output_bytes,
            isolated=self._bwrap is not None,
        )
