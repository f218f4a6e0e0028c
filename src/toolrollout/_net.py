"""Helpers shared by the local services toolrollout runs itself (sandbox, retriever)."""

from __future__ import annotations

import logging
import socket
import subprocess

import anyio
from anyio.abc import Process

__all__ = ["free_port", "is_listening", "open_file_limit", "stop_popen", "stop_process"]

logger = logging.getLogger("toolrollout")


async def is_listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (within 2 s)."""
    try:
        with anyio.fail_after(2):
            stream = await anyio.connect_tcp(host, port)
    except (OSError, TimeoutError):
        return False
    await stream.aclose()
    return True


async def stop_process(process: Process, *, grace: float = 5.0) -> None:
    """Terminate ``process``, kill it after ``grace`` seconds, and reap it (shielded)."""
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            process.terminate()
            with anyio.move_on_after(grace):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
        await process.aclose()


def stop_popen(process: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """The blocking twin of :func:`stop_process`, for services started with ``Popen``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace)


def open_file_limit(wanted: int) -> int:
    """Raise this process's soft open-file limit toward ``wanted``; return the limit now.

    Each pooled HTTP connection is a file descriptor, and the usual soft limit (1,024) is
    below what thousands of concurrent rollouts hold. Only the soft limit moves, up to the
    hard limit, as an unprivileged ``ulimit -n`` can; the caller decides what to do when
    the hard limit is lower still.
    """
    try:
        import resource
    except ImportError:  # not POSIX: nothing to raise, nothing known
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target <= soft:  # enough already, or the hard limit leaves nothing to raise
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        logger.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    logger.info("raised the open-file limit from %d to %d", soft, target)
    return target


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (IPv4 or IPv6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
