"""Every fenced command and Python block of the documentation runs as written.

Pages: README.md, tool_configs/README.md and docs/*.md (``tests/docs/_blocks.py``). Blocks
fenced as ``bash``/``sh``/``console`` run with bash, ``python`` blocks with the test's
interpreter (the project's virtualenv); other fences (yaml, json, text, untagged) are data
or output, not run. Each page runs top to bottom in one fresh folder (so a later block sees
the files an earlier one wrote) that links the checkout's ``tool_configs``, ``src``,
``scripts``, ``requirements`` and ``pyproject.toml``, holds copies of ``benchmarks`` and
``examples``, and has ``.venv`` pointing at the running virtualenv, whose ``bin`` also comes
first on ``PATH`` (so ``toolrollout``, ``python`` and ``.venv/bin/toolrollout`` all are the
checkout under test). Background jobs a bash block starts (``cmd &``) stay up for the
page's later blocks, as in a reader's terminal, and are killed with their process group
when the page ends.
A failure names the page and line of the block, with the end of its output.

Conventions a page uses (Markdown comments on the lines right above a fence are invisible
when rendered; the visible text around such a block says the same in words):

* ``<!-- not-run: <reason> -->``: the block is not run. Every such block is listed in
  ``NOT_RUN`` below with its reason, so a new one is a deliberate change of this file.
* ``<!-- docs-test: serve -->``: the block talks to an SGLang-compatible server on
  ``127.0.0.1:30000``; the test starts ``toolrollout serve`` (the demo model) on a free port
  (once per page, for every such block) and writes that port for ``30000`` in the block.
* ``<!-- docs-test: continues -->``: a Python block that continues the page's previous
  Python block (it uses its names); both run as one script.
* A Python block whose first line starts with ``# asyncio REPL`` is code for
  ``python -m asyncio`` (top-level ``await``); it is run as that REPL runs it, compiled with
  ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and awaited on a fresh event loop.

Commands that install (``python3 -m venv .venv``, ``pip install ...``, ``apt-get install``)
are not run here; a test checks them instead (they install from the checkout, name extras
that exist, and ``-r`` files that exist), and the rest of the command line runs in the
test's virtualenv, which ``.ci/run`` builds with the README's own install command. A
command that is a line of ``.ci/run`` (the whole test suite) is left to CI.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from tests._processes import free_port, wait_http
from tests.docs._blocks import ASYNCIO_REPL, PAGES, REPO, Block, read_blocks

import toolrollout
from toolrollout._supervisor import dying_with_this_process

NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/benchmarks.md", "VLLM_SERVER_DEV_MODE=1 VLLM_CP"): (
        "needs a vLLM server (.ci/vllm.sh, about two minutes to start) and verifiers in a "
        "virtualenv of its own (it would downgrade datasets); "
        "tests/real_engines/vllm/test_entry_points.py runs a small bench --engine-url"
    ),
    ("docs/engines.md", "VLLM_SERVER_DEV_MODE=1 VLLM_CP"): (
        "needs the vLLM virtualenv (.ci/vllm.sh) and a minute or two to start; "
        "tests/real_engines/vllm run these commands"
    ),
    (
        "docs/mcp.md",
        "from mcp.types import CreateMe",
    ): "needs an inference engine and a server that samples",
    ("docs/mcp.md", "mcp:"): "configuration fragment (an entry of a tool config)",
    ("docs/sandbox.md", "toolrollout sandbox serve --pr"): "serves until interrupted",
    ("docs/sandbox.md", "toolrollout sandbox serve --py"): "serves until interrupted",
    ("docs/security.md", 'TOOLROLLOUT_API_KEY="$KEY" too'): "needs a model folder and a GPU host",
    (
        "docs/security.md",
        "config:",
    ): "an excerpt of a tool config's entries (their tool_schema left out)",
    (
        "docs/security.md",
        'export SANDBOX_API_KEY="<the s',
    ): "needs a Ray cluster and the sandbox host above",
    (
        "docs/security.md",
        'export TOOLROLLOUT_API_KEY="$(',
    ): "starts a long-running server on a sandbox host",
    ("docs/benchmarks.md", "python benchmarks/bench_soak.p"): (
        "10,000 trajectories at concurrency 512, minutes of CPU; the figures it wrote are in "
        "benchmarks/results/soak.json"
    ),
    ("docs/benchmarks.md", "python benchmarks/bench_client"): (
        "five rounds of four worker processes, about 12 minutes of a loaded 2-core machine; "
        "the figures it wrote are in benchmarks/results/client_cpu.json"
    ),
    ("docs/benchmarks.md", "python benchmarks/bench_gatewa"): (
        "two servers and 96 requests, minutes of a busy 2-core machine; the figures it wrote "
        "are in benchmarks/results/gateway.json"
    ),
    ("docs/benchmarks.md", "toolrollout bench --plot bench"): (
        "the published workload, about 10 minutes of a 2-core machine"
    ),
    ("docs/benchmarks.md", "toolrollout bench --prompts 62"): (
        "three modes of 10,000 trajectories, 18 minutes of the 2-core machine"
    ),
    ("docs/benchmarks.md", "toolrollout bench --concurrenc"): (
        "three modes of 10,000 trajectories, 12 minutes of the 2-core machine"
    ),
    ("docs/benchmarks.md", "toolrollout bench --mode toolr"): (
        "two modes of 1,024 and two of 10,000 trajectories, 14 minutes of the 2-core machine"
    ),
    ("docs/benchmarks.md", "SGLANG_USE_CPU_ENGINE=1 OMP_NU"): (
        "needs the real SGLang (.ci/sglang.sh; one to three minutes to start here) and "
        "verifiers in a virtualenv of its own (it would downgrade datasets); "
        "tests/real_engines/vllm/test_entry_points.py runs a small bench --engine-url"
    ),
    ("docs/engines.md", "class Engine(ABC):"): ("an outline of the abstract class, not a program"),
    ("docs/engines.md", "python -m sglang.launch_server"): (
        "needs a GPU, SGLang and a 7B model download"
    ),
    ("docs/engines.md", "SGLANG_USE_CPU_ENGINE=1 .engin"): (
        "starts the real SGLang server from .engines/sglang (built by .ci/sglang.sh); "
        "tests/real_engines/sglang runs exactly this"
    ),
    ("docs/engines.md", "VLLM_SERVER_DEV_MODE=1 vllm se"): (
        "starts a vLLM server, which serves until interrupted (tests/real_engines/vllm run it)"
    ),
    ("docs/fault-tolerance.md", "python benchmarks/bench_soak.p"): (
        "10,000 trajectories at concurrency 512, minutes of CPU; the figures it wrote are in "
        "benchmarks/results/soak.json"
    ),
    ("docs/multimodal.md", "python -m toolrollout.apps.dem"): (
        "retrains the VL demo model (CPU training, far beyond the docs test's time)"
    ),
    ("docs/multimodal.md", "mkdir text_base && for f in ch"): (
        "a maintainer step; reads commit 9ceb368 from git history (absent from a shallow clone)"
        " and writes 192 clips"
    ),
    ("docs/quickstart.md", "bash scripts/train_demo.sh    "): (
        "trains the demo model, about an hour on one core (stage 1 alone, a third of that)"
    ),
    ("docs/scale-out.md", "# inference: SGLang servers on"): (
        "needs GPU nodes with SGLang and a multi-node Ray cluster; tests/distributed start a "
        "local two-node cluster"
    ),
    ("docs/search.md", "python search_r1/search/retrie"): (
        "needs a Search-R1 checkout, its FAISS index and the 2018 Wikipedia dump (tens of GB)"
    ),
    ("docs/trainers.md", "python -m verl.trainer.main_pp"): (
        "starts verl's PPO trainer, which needs GPUs and its Ray cluster"
    ),
    ("docs/trainers.md", 'PLUGIN=$(python -c "import too'): (
        "swift rollout serves the model with vLLM, which needs a GPU (and downloads the model)"
    ),
    ("docs/trainers.md", "TOOLROLLOUT_ENGINE_URL=http://"): (
        "swift rlhf trains with vLLM rollouts, which need a GPU (and downloads the model)"
    ),
    ("docs/trainers.md", ".venv/bin/pip install -r requi"): (
        "runs the trainer adapter tests (minutes); CI runs them with the whole suite"
    ),
    ("docs/trainers.md", "python examples/grpo_python.py"): ("trains for many minutes"),
    ("docs/trainers.md", "python -m toolrollout eval --m"): (
        "needs the published run's held-out file and sandbox config"
    ),
    ("docs/trainers.md", "python -m toolrollout.apps.dem"): (
        "downloads a 93 MB wheel and converts it (about a minute)"
    ),
    ("docs/trainers.md", 'MODEL="$(python -m toolrollout'): (
        "needs the converted model (python -m toolrollout.apps.demo_smollm.build)"
    ),
    ("docs/trainers.md", "SGLANG_USE_CPU_ENGINE=1 .engin"): ("starts real engine servers"),
    ("docs/trainers.md", "python examples/grpo_smollm.py"): ("trains for many minutes"),
}
"""(page, start of the block's first line) -> why it is not run (the page's marker text)."""

OPTIONS = frozenset({"serve", "continues"})
BLOCK_TIMEOUT_S = 240.0
VENV = Path(sys.prefix)
SOURCE = Path(toolrollout.__file__).resolve().parents[1]
CI_LINES = frozenset(
    line.strip()
    for script in ("run", "setup")
    for line in (REPO / ".ci" / script).read_text().splitlines()
    if line.strip()
)
"""Lines of .ci/run and .ci/setup (what CI runs, so the docs test leaves them to it)."""
_INSTALL = re.compile(
    r"^(sudo\s+)?(python3? -m venv \S+|(\S*/)?pip3? install\b.*|apt-get (update|install)\b.*)$"
)
_COMMANDISH = re.compile(r"^(\$ )?(toolrollout|python3?|pip3?|bash|\.venv/)\b")


def _all_blocks() -> list[Block]:
    return [block for page in PAGES for block in read_blocks(page)]


def _logical_lines(code: str) -> list[str]:
    """Shell lines with backslash continuations joined."""
    out: list[str] = []
    current = ""
    for raw in code.splitlines():
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        out.append(current + raw)
        current = ""
    if current:
        out.append(current)
    return out


def _strip_comment(line: str) -> str:
    """The command without a trailing ``# comment`` (outside quotes)."""
    quote: str | None = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def _segments(line: str) -> list[str]:
    return [part.strip() for part in _strip_comment(line).split("&&")]


def _extras() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def install_problems(segment: str) -> list[str]:
    """What is wrong with one install command (an empty list when nothing is)."""
    if "pip" not in segment.split()[0] and not re.search(r"\bpip3? install\b", segment):
        return []
    words = shlex.split(segment)
    words = words[words.index("install") + 1 :]
    problems = []
    extras = _extras()
    for i, word in enumerate(words):
        if word.startswith("toolrollout"):
            problems.append(
                f"{word!r}: toolrollout is installed from the checkout (pip install -e '.[...]')"
            )
        elif word == "." or word.startswith(".["):
            named = re.findall(r"[\w-]+", word[2:-1]) if word.startswith(".[") else []
            problems += [
                f"{word!r}: no extra {name!r} in pyproject.toml"
                for name in named
                if name not in extras
            ]
        elif words[i - 1] == "-r" and i > 0 and not (REPO / word).is_file():
            problems.append(f"-r {word}: no such file in the checkout")
    return problems


def _runnable_shell(code: str) -> str:
    """The block with install commands and CI's own commands taken out."""
    kept: list[str] = []
    for line in _logical_lines(code):
        parts = _segments(line)
        if not any(parts):
            kept.append(line)
            continue
        run = [p for p in parts if not _INSTALL.match(p) and p not in CI_LINES]
        if len(run) == len(parts):
            kept.append(line)
        elif run:
            kept.append(" && ".join(run))
    return "\n".join(kept) + "\n"


def _page_dir(tmp: Path) -> Path:
    for name in ("tool_configs", "src", "scripts", "requirements", "pyproject.toml"):
        (tmp / name).symlink_to(REPO / name)
    for name in ("benchmarks", "examples"):
        shutil.copytree(REPO / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / ".venv").symlink_to(VENV)
    return tmp


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SOURCE), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.pop("VIRTUAL_ENV", None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "120"
    return env


_REPL_RUNNER = """\
import ast, asyncio, sys
path = sys.argv[1]
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
result = eval(code, namespace)
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""


def _run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float, jobs: list[int]
) -> tuple[int, str]:
    """Run ``argv`` in its own process group; background jobs it leaves stay up (as in a
    reader's terminal) until the page ends, their group ids appended to ``jobs``."""
    log = cwd / ".block-output"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        jobs.append(process.pid)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            code = -1
    text = log.read_text(errors="replace")
    if code == -1:
        text += f"\n(timed out after {timeout:.0f} s)"
    return code, text


def _kill_group(pgid: int) -> None:
    """End a process group (a block's shell and every background job it started)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class _Server:
    """``toolrollout serve`` with the demo model on a free port, for ``docs-test: serve``."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = (cwd / f".serve-{self.port}.log").open("wb")
        # As the pages say: checkpoints the server may load live under ./ckpt.
        command = [str(VENV / "bin" / "toolrollout"), "serve", "--port", str(self.port)]
        command += ["--weights-dir", str(cwd / "ckpt")]
        # Behind the parent-death launcher: a test run that is killed (not ended) takes its
        # server along instead of leaving it on its port.
        self.process = subprocess.Popen(
            dying_with_this_process(command),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_http(f"http://127.0.0.1:{self.port}/health", 120, self.process)

    def close(self) -> None:
        _kill_group(self.process.pid)
        self.process.wait()
        self.log.close()


class _Page:
    """What the blocks of one page share: the folder, background jobs, the demo server."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = _env()
        self.jobs: list[int] = []
        self.python: list[str] = []
        self.server: _Server | None = None

    def port(self) -> int:
        """The ``docs-test: serve`` server, started by the page's first block that asks."""
        if self.server is None:
            self.server = _Server(self.cwd, self.env)
        return self.server.port

    def close(self) -> None:
        for pgid in self.jobs:
            _kill_group(pgid)
        if self.server is not None:
            self.server.close()


def run_block(block: Block, page: _Page) -> None:
    """Run one block in the page's folder; fail naming its page and line."""
    code = block.code
    if block.kind == "python" and "continues" in block.options:
        assert page.python, f"{block.where}: 'continues' with no Python block before it"
        code = page.python[-1] + code
    if block.kind == "python":
        page.python.append(code)
    if "serve" in block.options:
        code = code.replace("30000", str(page.port()))
    script = page.cwd / f".block-{block.line}"
    if block.kind == "bash":
        script.write_text("set -eo pipefail\n" + _runnable_shell(code))
        argv = ["bash", str(script)]
    elif code.lstrip().startswith(ASYNCIO_REPL):
        script.write_text(code)
        argv = [sys.executable, "-c", _REPL_RUNNER, str(script)]
    else:
        script.write_text(code)
        argv = [sys.executable, str(script)]
    rc, output = _run(argv, page.cwd, page.env, BLOCK_TIMEOUT_S, page.jobs)
    if rc != 0:
        pytest.fail(f"{block.where}: the {block.lang} block exited {rc}:\n{output[-4000:]}")


# ---- checks that need no run -------------------------------------------------------------


def test_markers_are_known_and_listed() -> None:
    marked = {}
    for block in _all_blocks():
        for option in block.options:
            assert option in OPTIONS, f"{block.where}: unknown marker 'docs-test: {option}'"
        if block.not_run is not None:
            assert block.not_run, f"{block.where}: a not-run marker needs its reason"
            marked[(block.page, block.first_line[:30])] = block.not_run
    assert marked == NOT_RUN


def test_commands_are_fenced_as_code() -> None:
    """An untagged block of commands would silently escape this test."""
    for block in _all_blocks():
        if block.lang == "" and _COMMANDISH.match(block.first_line):
            pytest.fail(f"{block.where}: commands in an untagged fence; fence it as bash")


def test_install_commands_install_from_the_checkout() -> None:
    problems = []
    for block in _all_blocks():
        if block.kind != "bash":
            continue
        for line in _logical_lines(block.code):
            for segment in _segments(line):
                if _INSTALL.match(segment):
                    problems += [f"{block.where}: {p}" for p in install_problems(segment)]
    assert not problems, "\n".join(problems)


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's second line is .ci/run's install (.ci/setup) plus its pytest run."""
    (first,) = (b for b in read_blocks("README.md") if b.kind == "bash")
    test_line = _logical_lines(first.code)[1]
    for segment in _segments(test_line):
        assert _INSTALL.match(segment) or segment in CI_LINES, segment
    assert " && ".join(_segments(test_line)[:-1]) in CI_LINES


def test_install_check_catches_mistakes() -> None:
    assert install_problems("pip install 'toolrollout[eval]'")
    assert install_problems("pip install -e '.[nosuchextra]'")
    assert install_problems("pip install -r requirements/missing.txt")
    assert not install_problems("pip install torch==2.13.0 -e '.[eval,serve]'")
    assert _runnable_shell("python3 -m venv .venv && .venv/bin/pip install -e . && ls\n") == (
        "ls\n"
    )


# ---- the run -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.docs
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    shared = _Page(_page_dir(tmp_path))
    try:
        for block in read_blocks(page):
            if block.kind is None or block.not_run is not None:
                continue
            run_block(block, shared)
    finally:
        shared.close()
