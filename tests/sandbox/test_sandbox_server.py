"""Containment of the local sandbox, shown against the real server running with bubblewrap.

Every test posts to ``toolrollout sandbox serve`` (a subprocess, see conftest.py) and checks
both the program's view (what it could and could not do) and the host's (nothing leaked).
"""

from __future__ import annotations

import base64
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from tests.sandbox._support import SERVER_MAX_OUTPUT, SERVER_MAX_PROCESSES

from toolrollout.sandbox._runner import SUPPORTED_LANGUAGES

REPO = Path(__file__).resolve().parents[2]

RUN_CODE_RESPONSE_KEYS = {
    "status",
    "message",
    "compile_result",
    "run_result",
    "executor_pod_name",
    "files",
}
COMMAND_RESULT_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}


def run(url: str, code: str, language: str = "python", **fields: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{url}/run_code", json={"code": code, "language": language, **fields}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def assert_healthy(url: str) -> None:
    """The server still answers, and runs a plain program normally."""
    assert httpx.get(f"{url}/v1/ping", timeout=5).json() == "pong"
    body = run(url, "print(1 + 1)")
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "2\n"


def host_processes_with(marker: str) -> list[int]:
    """PIDs (in the host's view) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def test_plain_program_has_sandbox_fusions_response_shape(sandbox_url: str) -> None:
    body = run(sandbox_url, "print(1 + 1)")
    assert set(body) == RUN_CODE_RESPONSE_KEYS
    assert body["status"] == "Success"
    assert body["message"] == ""
    assert body["compile_result"] is None
    assert body["files"] == {}
    result = body["run_result"]
    assert set(result) == COMMAND_RESULT_KEYS
    assert result["status"] == "Finished"
    assert result["return_code"] == 0
    assert result["stdout"] == "2\n"
    assert result["stderr"] == ""
    assert 0 < result["execution_time"] < 10


def test_ping_health_and_server_info(sandbox_url: str) -> None:
    assert httpx.get(f"{sandbox_url}/v1/ping").json() == "pong"
    # The open probe says up or down, nothing about the host (docs/security.md).
    assert httpx.get(f"{sandbox_url}/health").json() == {"status": "ok"}
    info = httpx.get(f"{sandbox_url}/server_info").json()
    assert info["status"] == "ok"
    assert info["isolation"] == "bwrap"
    assert info["languages"][:2] == ["python", "bash"]
    assert set(info["languages"]) | set(info["not_installed"]) == set(SUPPORTED_LANGUAGES)
    assert {"python", "bwrap_version", "privileged", "seccomp"} <= set(info)


def test_failures_follow_sandbox_fusions_status_rule(sandbox_url: str) -> None:
    body = run(sandbox_url, "import sys\nprint('out')\nsys.exit(3)")
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 3
    assert body["run_result"]["stdout"] == "out\n"

    body = run(sandbox_url, "raise ValueError('boom')")
    assert body["status"] == "Failed"
    assert "ValueError: boom" in body["run_result"]["stderr"]


def test_bash_stdin_and_files(sandbox_url: str) -> None:
    files = {"data.txt": base64.b64encode(b"from file\n").decode()}
    body = run(
        sandbox_url,
        'read line; echo "got $line"; cat data.txt; pwd',
        "bash",
        stdin="hi\n",
        files=files,
    )
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "got hi\nfrom file\n/sandbox\n"

    body = run(
        sandbox_url,
        "print(open('data.txt').read().strip())\nopen('out/result.txt', 'w').write('done')",
        files={**files, "out/keep": base64.b64encode(b"").decode()},
        fetch_files=["out/result.txt", "missing.txt"],
    )
    assert body["status"] == "Success", body
    assert body["run_result"]["stdout"] == "from file\n"
    assert body["files"] == {"out/result.txt": base64.b64encode(b"done").decode()}


def test_unsupported_languages(sandbox_url: str) -> None:
    # A Sandbox Fusion language without a toolchain here: its shell's "not found", as there.
    body = run(sandbox_url, "select 1;", "sql")
    assert body["status"] == "Failed"
    assert body["compile_result"] is None
    assert body["run_result"]["return_code"] == 127
    assert "'sql' is not supported by this sandbox" in body["run_result"]["stderr"]
    # Not a Sandbox Fusion language at all: a validation error, as there.
    answer = httpx.post(f"{sandbox_url}/run_code", json={"code": "", "language": "klingon"})
    assert answer.status_code == 422


def test_network_is_unreachable(sandbox_url: str) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
import socket
print(sorted(name for _, name in socket.if_nameindex()))
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("10.0.2.2", 80)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print(host, "CONNECTED")
    except OSError as e:
        print(host, type(e).__name__)
"""
        body = run(sandbox_url, code)
        assert body["status"] == "Success", body
        lines = body["run_result"]["stdout"].splitlines()
        assert lines[0] == "['lo']"  # a private network namespace: loopback only
        assert lines[1] == "127.0.0.1 ConnectionRefusedError"  # not the host's loopback
        assert all("CONNECTED" not in line for line in lines[1:])
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host's listener


def test_writes_outside_the_sandbox_are_refused(sandbox_url: str) -> None:
    # The repository's files are hidden (its folder itself may exist, empty, as the parent
    # of the sandbox runtime under .sandbox-runtime/, which is bound read-only).
    marker = f"sandbox-escape-{uuid.uuid4().hex}"
    targets = ["/usr", "/etc", "/", "/bin", "/root", str(REPO), str(REPO / "src")]
    code = f"""
import os
for d in {targets!r}:
    try:
        open(os.path.join(d, {marker!r}), "w").write("x")
        print(d, "WROTE")
    except OSError as e:
        print(d, type(e).__name__)
print("repo visible", os.path.exists({str(REPO / "pyproject.toml")!r}))
for d in ["/tmp", "/sandbox", "/dev/shm"]:
    open(os.path.join(d, "ok"), "w").write("x")
    print(d, "ok")
"""
    body = run(sandbox_url, code)
    assert body["status"] == "Success", body
    out = body["run_result"]["stdout"]
    assert "WROTE" not in out
    assert "repo visible False" in out
    assert "/tmp ok" in out and "/sandbox ok" in out and "/dev/shm ok" in out
    for directory in targets:
        assert not Path(directory, marker).exists()


def test_no_privileges_and_no_nested_user_namespaces(sandbox_url: str) -> None:
    code = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(os.getuid(), status["CapEff"].strip(), status["NoNewPrivs"].strip())
thread = threading.Thread(target=print, args=("thread ok",))
thread.start()
thread.join()
print(subprocess.run(["echo", "child ok"], capture_output=True, text=True).stdout.strip())
"""
    body = run(sandbox_url, code)
    assert body["status"] == "Success", body
    refused, uid_caps, thread, child = body["run_result"]["stdout"].splitlines()
    assert refused == "-1 1"  # EPERM from the seccomp filter
    uid, caps, no_new_privs = uid_caps.split()
    assert int(uid) != 0
    assert caps == "0000000000000000"
    assert no_new_privs == "1"
    assert (thread, child) == ("thread ok", "child ok")  # clone3 -> ENOSYS -> clone works


def test_process_limit_and_fork_bomb(sandbox_url: str) -> None:
    counted = run(
        sandbox_url,
        """
import os, time
n = 0
try:
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, type(e).__name__)
""",
    )
    assert counted["status"] == "Success", counted
    made, error = counted["run_result"]["stdout"].split()
    assert int(made) < SERVER_MAX_PROCESSES
    assert error == "BlockingIOError"  # EAGAIN from RLIMIT_NPROC

    started = time.monotonic()
    bomb = run(
        sandbox_url,
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        run_timeout=2,
    )
    assert time.monotonic() - started < 10
    assert bomb["status"] == "Failed"
    assert bomb["run_result"]["status"] == "TimeLimitExceeded"

    shell_bomb = run(sandbox_url, ":(){ :|:& };:\nsleep 30", "bash", run_timeout=1)
    assert shell_bomb["status"] == "Failed"
    assert_healthy(sandbox_url)


def test_memory_bomb_is_stopped(sandbox_url: str) -> None:
    body = run(
        sandbox_url, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))"
    )
    assert body["status"] == "Failed"
    assert body["run_result"]["status"] == "Finished"
    assert "MemoryError" in body["run_result"]["stderr"]

    # A request may ask for less than the server's cap (SERVER_MEMORY_MB in these tests).
    small = run(sandbox_url, "x = bytearray(100 * 1024 * 1024)\nprint('ok')", memory_limit_MB=64)
    assert "MemoryError" in small["run_result"]["stderr"]
    fits = run(sandbox_url, "x = bytearray(100 * 1024 * 1024)\nprint('ok')")
    assert fits["run_result"]["stdout"] == "ok\n", fits
    assert_healthy(sandbox_url)


def test_file_size_is_limited(sandbox_url: str) -> None:
    body = run(
        sandbox_url,
        "with open('/tmp/big', 'wb') as f:\n    f.write(bytes(65 * 1024 * 1024))",
    )
    assert body["status"] == "Failed"
    assert "File too large" in body["run_result"]["stderr"]


async def test_endless_loop_times_out_and_its_whole_process_tree_dies(sandbox_url: str) -> None:
    marker = f"{time.time_ns() % 10**6 + 1000}.{os.getpid()}"
    # The background child even starts a new session: killing the process group alone
    # would miss it; the PID namespace does not.
    code = f"""
import subprocess
subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
print("started", flush=True)
while True:
    pass
"""
    result: dict[str, Any] = {}

    async def post() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(
                f"{sandbox_url}/run_code",
                json={"code": code, "language": "python", "run_timeout": 1.5},
            )
            result.update(answer.json())

    async with anyio.create_task_group() as tg:
        tg.start_soon(post)
        with anyio.fail_after(10):
            while not host_processes_with(marker) and not result:  # noqa: ASYNC110 (polls /proc)
                await anyio.sleep(0.05)
        seen_running = bool(host_processes_with(marker))

    assert seen_running, "the background sleep never started"
    assert result["status"] == "Failed"
    run_result = result["run_result"]
    assert run_result["status"] == "TimeLimitExceeded"
    assert run_result["return_code"] is None
    assert 1.4 < run_result["execution_time"] < 5
    assert run_result["stdout"] == "started\n"
    with anyio.fail_after(5):
        while host_processes_with(marker):  # noqa: ASYNC110 (polls /proc)
            await anyio.sleep(0.05)
    assert_healthy(sandbox_url)


def test_huge_output_is_truncated(sandbox_url: str) -> None:
    body = run(sandbox_url, "import sys\nsys.stdout.write('x' * 5_000_000)\nprint('tail')")
    assert body["status"] == "Success", body["message"]
    stdout = body["run_result"]["stdout"]
    assert stdout.startswith("x" * SERVER_MAX_OUTPUT)
    assert f"[truncated: {5_000_005 - SERVER_MAX_OUTPUT} more bytes not shown]" in stdout
    assert len(stdout) < SERVER_MAX_OUTPUT + 100

    endless = run(sandbox_url, "yes", "bash", run_timeout=1)
    assert endless["run_result"]["status"] == "TimeLimitExceeded"
    assert "[truncated: " in endless["run_result"]["stdout"]
    assert len(endless["run_result"]["stdout"]) < SERVER_MAX_OUTPUT + 100
    assert_healthy(sandbox_url)


def test_fetch_files_does_not_follow_symlinks_out(sandbox_url: str) -> None:
    body = run(
        sandbox_url,
        "import os\nos.symlink('/etc/passwd', 'leak')\nos.symlink('/etc', 'etc')\n"
        "open('real', 'w').write('r')",
        fetch_files=["leak", "etc/passwd", "real", "../../etc/passwd", "/etc/passwd"],
    )
    assert body["status"] == "Success", body
    assert set(body["files"]) == {"real"}
    # Nothing left out silently: each refusal is named in the message.
    assert "'leak' cannot be read (a symlink)" in body["message"]
    assert "'etc/passwd' is reached through a symlink" in body["message"]
    assert "'../../etc/passwd' must stay inside" in body["message"]
    assert "'/etc/passwd' must be relative, or under /sandbox or /tmp" in body["message"]


def test_runs_in_parallel_up_to_the_limit(sandbox_url: str) -> None:
    """--max-concurrency 2: four 0.6 s programs take two rounds, and uids differ."""

    async def main() -> list[dict[str, Any]]:
        bodies: list[dict[str, Any]] = []
        async with httpx.AsyncClient(timeout=60) as client:

            async def one() -> None:
                answer = await client.post(
                    f"{sandbox_url}/run_code",
                    json={
                        "code": "import os, time\ntime.sleep(0.6)\nprint(os.getuid())",
                        "language": "python",
                    },
                )
                bodies.append(answer.json())

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one)
        return bodies

    started = time.monotonic()
    bodies = anyio.run(main)
    elapsed = time.monotonic() - started
    assert all(b["status"] == "Success" for b in bodies), bodies
    assert 1.2 <= elapsed < 6
    if os.geteuid() == 0:  # one uid per concurrent slot
        uids = {int(b["run_result"]["stdout"]) for b in bodies}
        assert len(uids) == 2 and all(uid >= 60000 for uid in uids)
