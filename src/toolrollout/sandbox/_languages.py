"""The toolchain behind each Sandbox Fusion ``language`` the local sandbox can run.

File names and command lines follow Sandbox Fusion's runners (``sandbox/runners/major.py``);
``c`` is toolrollout's own key.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["SEARCH_PATH", "TOOLCHAINS", "Toolchain", "resolve_program", "support_paths"]

SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
"""Where toolchain programs are looked up (not the server's ``$PATH``: a program must be
visible inside the sandbox, whose only host directory trees are ``/usr`` and those it
binds read-only)."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    """How one language is compiled and run. Commands are argv lists whose items may hold
    ``{NAME}`` placeholders for programs (resolved at start-up) and ``{source}``,
    ``{classpath}`` (``.`` and the request's ``.jar`` files, as Sandbox Fusion's) and
    ``{heap_mb}``."""

    language: str
    source: str
    """File name the code is written to in the working directory."""
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    programs: tuple[str, ...] = ()
    """Executables the commands name as ``{program}``; all must be installed."""
    address_space_limit: bool = False
    """Enforce the memory limit as RLIMIT_AS rather than RLIMIT_DATA (runtimes that reserve
    large address ranges up front, the JVM, V8, Go, fail under an address-space cap)."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra environment of both steps."""
    compile_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra environment of the compile step only."""


# numpy/scipy's BLAS start a thread (with its own buffers) per host core, which neither the
# memory limit nor RLIMIT_NPROC of a sandbox would let through on a many-core host.
_ONE_THREAD = MappingProxyType(
    {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
)

# The JVM sizes its thread pools by the machine's cores; these keep a run's threads well
# under the sandbox's RLIMIT_NPROC on a many-core host.
# ``{heap_mb}``: half the step's memory limit; the JVM's default heap (a quarter of the
# host's memory) would not fit under the limit.
_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xmx{heap_mb}m")

TOOLCHAINS: Mapping[str, Toolchain] = MappingProxyType(
    {
        tc.language: tc
        for tc in (
            Toolchain(
                "python",
                "main.py",
                ("{python}", "{source}"),
                address_space_limit=True,
                env=_ONE_THREAD,
            ),
            Toolchain("bash", "main.sh", ("{bash}", "{source}"), address_space_limit=True),
            Toolchain(
                "c",
                "main.c",
                ("./test",),
                compile=("{gcc}", "{source}", "-o", "test", "-lm"),
                programs=("gcc",),
            ),
            Toolchain(
                "cpp",
                "main.cpp",
                ("./test",),
                compile=("{g++}", "-std=c++17", "{source}", "-o", "test"),
                programs=("g++",),
            ),
            Toolchain(
                "go",
                "main.go",
                ("./out",),
                compile=("{go}", "build", "-o", "out", "{source}"),
                programs=("go",),
                env=MappingProxyType(
                    {"GOCACHE": "/tmp/.cache/go-build", "GOPATH": "/tmp/go", "GO111MODULE": "off"}
                ),
                compile_env=MappingProxyType({"GOMAXPROCS": "2", "GOFLAGS": "-p=2"}),
            ),
            Toolchain(
                "java",
                "Main.java",
                ("{java}", *_JVM, "-cp", "{classpath}", "-ea", "Main"),
                compile=(
                    "{javac}",
                    *(f"-J{flag}" for flag in _JVM),
                    "-cp",
                    "{classpath}",
                    "{source}",
                ),
                programs=("javac", "java"),
            ),
            Toolchain("nodejs", "main.js", ("{node}", "{source}"), programs=("node",)),
            Toolchain("typescript", "main.ts", ("{tsx}", "{source}"), programs=("tsx", "node")),
            Toolchain(
                "rust",
                "main.rs",
                ("./test",),
                compile=("{rustc}", "{source}", "-o", "test"),
                programs=("rustc",),
            ),
            Toolchain("perl", "main.pl", ("{perl}", "{source}"), programs=("perl",)),
            Toolchain("ruby", "main.rb", ("{ruby}", "{source}"), programs=("ruby",)),
            Toolchain("lua", "main.lua", ("{lua}", "{source}"), programs=("lua",)),
        )
    }
)
"""Every language the local sandbox knows how to run, installed or not."""


def resolve_program(name: str, configured: Mapping[str, str]) -> str | None:
    """The absolute path of program ``name``: ``configured[name]`` if given (a path or a
    name on :data:`SEARCH_PATH`), else ``name`` on :data:`SEARCH_PATH`; None if missing."""
    wanted = configured.get(name, name)
    found = shutil.which(wanted, path=SEARCH_PATH) if os.sep not in wanted else wanted
    if found is None or not os.access(found, os.X_OK):
        return None
    return os.path.abspath(found)


def support_paths(program: str) -> tuple[str, ...]:
    """Host paths outside ``/usr`` a program needs read access to: the JVM's
    configuration (``/etc/java-*``, where Debian's JDK links ``conf`` to), and a program
    installed outside ``/usr`` (tsx under a ``node_modules`` folder: that folder)."""
    real = os.path.realpath(program)
    paths: list[str] = []
    if os.path.basename(real) in ("java", "javac"):
        paths += sorted(glob.glob("/etc/java-*"))
    if not real.startswith("/usr/"):
        parts = real.split(os.sep)
        if "node_modules" in parts:
            paths.append(os.sep.join(parts[: parts.index("node_modules") + 1]))
        else:
            paths.append(os.path.dirname(real))
    return tuple(paths)
