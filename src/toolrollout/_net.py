"""Helpers shared by the local services toolrollout runs itself (sandbox, retriever)."""

from __future__ import annotations

import subprocess

import anyio
from anyio.abc import Process

__all__ = ["is_listening", "stop_popen", "stop_process"]


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
