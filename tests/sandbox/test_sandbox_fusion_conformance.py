"""``toolrollout sandbox serve`` against code written by others: the official Sandbox Fusion
client (PyPI ``sandbox-fusion``: its request and response models and its ``run_code``) and
verl's Sandbox Fusion reward scorer (``verl.utils.reward_score.sandbox_fusion``, whose
``_process_single_case`` is also what verl's ``SandboxFusionTool`` runs code through).

Every answer is read back with the client's own pydantic models, so a field the server
names, types or fills differently from Sandbox Fusion fails here.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest
import sandbox_fusion as sf
from tests.sandbox._support import require_language, require_runtime_python

HELLO = {
    # language: (program doubling the number on stdin, what it prints for 21)
    "python": ("print('python', int(input()) * 2)", "python 42\n"),
    "bash": ('read x; echo "bash $((x * 2))"', "bash 42\n"),
    "c": (
        '#include <stdio.h>\nint main(void){int x; scanf("%d", &x); printf("c %d\\n", 2 * x);}',
        "c 42\n",
    ),
    "cpp": (
        '#include <iostream>\nint main(){int x; std::cin >> x; std::cout << "cpp " << 2 * x'
        ' << "\\n";}',
        "cpp 42\n",
    ),
    "go": (
        'package main\nimport "fmt"\nfunc main() { var x int; fmt.Scan(&x); fmt.Println("go",'
        " 2*x) }",
        "go 42\n",
    ),
    "java": (
        "import java.util.Scanner;\npublic class Main { public static void main(String[] a) {"
        ' int x = new Scanner(System.in).nextInt(); System.out.println("java " + 2 * x); } }',
        "java 42\n",
    ),
    "nodejs": (
        'const x = parseInt(require("fs").readFileSync(0, "utf8")); console.log("nodejs", 2 * x)',
        "nodejs 42\n",
    ),
    "typescript": (
        'import { readFileSync } from "fs";\nconst x: number = parseInt(readFileSync(0, "utf8"));'
        '\nconsole.log("typescript", 2 * x);',
        "typescript 42\n",
    ),
    "rust": (
        "use std::io::Read;\nfn main() { let mut s = String::new();"
        " std::io::stdin().read_to_string(&mut s).unwrap(); let x: i64 = s.trim().parse()"
        '.unwrap(); println!("rust {}", 2 * x); }',
        "rust 42\n",
    ),
    "perl": ('my $x = <STDIN>; print "perl ", 2 * $x, "\\n";', "perl 42\n"),
    "ruby": ('puts "ruby #{2 * gets.to_i}"', "ruby 42\n"),
    "lua": ('local x = io.read("n"); print("lua " .. 2 * x)', "lua 42\n"),
}
COMPILED = {"c", "cpp", "go", "java", "rust"}


# Unless a test sets them: generous timeouts, as compilers on a loaded CI machine (rustc,
# javac, tsx's start) can take many seconds.
SLOW_OK = {"compile_timeout": 60, "run_timeout": 60}


def client_run(url: str, **fields: Any) -> sf.RunCodeResponse:
    """The official client's ``run_code`` (one attempt: a SandboxError raises at once)."""
    fields = {**SLOW_OK, **fields}
    return sf.run_code(sf.RunCodeRequest(**fields), endpoint=url, max_attempts=1)


def raw(url: str, **fields: Any) -> sf.RunCodeResponse:
    """POST /run_code as JSON and read the answer with the client's model (any status)."""
    fields = {**SLOW_OK, **fields}
    answer = httpx.post(f"{url}/run_code", json=fields, timeout=120)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == set(sf.RunCodeResponse.__fields__)
    for key in ("compile_result", "run_result"):
        if body[key] is not None:  # every field we send is one the client's model has
            assert set(body[key]) <= set(sf.models.CommandRunResult.__fields__)
    return sf.RunCodeResponse.parse_obj(body)


MAPPING = sf.SummaryMapping(
    Success="ok",
    Failed="failed",
    CompileFailed="compile-failed",
    CompileTimeout="compile-timeout",
    RunFailed="run-failed",
    RunTimeout="run-timeout",
)


@pytest.mark.parametrize("language", sorted(HELLO))
def test_languages_through_the_official_client(sandbox_url: str, language: str) -> None:
    require_language(sandbox_url, language)
    code, expected = HELLO[language]
    # ``c`` is toolrollout's own key, which the client's request model does not allow.
    send = raw if language == "c" else client_run
    response = send(sandbox_url, code=code, language=language, stdin="21\n")
    assert response.status == sf.RunStatus.Success, response
    assert response.message == ""
    assert response.run_result is not None
    assert response.run_result.status == sf.CommandRunStatus.Finished
    assert response.run_result.return_code == 0
    assert response.run_result.stdout == expected
    if language in COMPILED:
        assert response.compile_result is not None
        assert response.compile_result.status == sf.CommandRunStatus.Finished
        assert response.compile_result.return_code == 0
    else:  # Sandbox Fusion runs these (typescript through tsx) without a compile step
        assert response.compile_result is None
    assert sf.summary_run_code_result(response, MAPPING) == "ok"


def test_c_program_is_isolated_like_python(sandbox_url: str) -> None:
    require_language(sandbox_url, "cpp")
    code = (
        "#include <fstream>\n#include <iostream>\n#include <unistd.h>\n"
        'int main() { std::ofstream f("/usr/escape"); std::cout << (f ? "WROTE" : "refused")'
        ' << " " << getuid() << " " << (access("/etc/passwd", F_OK) == 0) << "\\n"; }'
    )
    response = client_run(sandbox_url, code=code, language="cpp")
    assert response.run_result is not None
    out = (response.run_result.stdout or "").split()
    assert out[0] == "refused" and out[1] != "0" and out[2] == "0", out


def test_statuses_and_limits_as_the_client_reads_them(sandbox_url: str) -> None:
    require_language(sandbox_url, "cpp")
    broken = raw(sandbox_url, code="int main() { return x; }", language="cpp")
    assert broken.status == sf.RunStatus.Failed
    assert broken.run_result is None
    assert broken.compile_result is not None
    assert broken.compile_result.status == sf.CommandRunStatus.Finished
    assert broken.compile_result.return_code not in (None, 0)
    assert "error" in (broken.compile_result.stderr or "")
    assert sf.summary_run_code_result(broken, MAPPING) == "compile-failed"

    slow_compile = raw(sandbox_url, code="int main() {}", language="cpp", compile_timeout=0.01)
    assert slow_compile.compile_result is not None
    assert slow_compile.compile_result.status == sf.CommandRunStatus.TimeLimitExceeded
    assert slow_compile.compile_result.return_code is None
    assert sf.summary_run_code_result(slow_compile, MAPPING) == "compile-timeout"

    endless = raw(sandbox_url, code="while True: pass", language="python", run_timeout=1)
    assert endless.status == sf.RunStatus.Failed
    assert endless.run_result is not None
    assert endless.run_result.status == sf.CommandRunStatus.TimeLimitExceeded
    assert endless.run_result.return_code is None
    assert 1 <= (endless.run_result.execution_time or 0) < 5
    assert sf.summary_run_code_result(endless, MAPPING) == "run-timeout"

    crash = raw(sandbox_url, code="exit 3", language="bash")
    assert crash.status == sf.RunStatus.Failed
    assert crash.run_result is not None and crash.run_result.return_code == 3
    assert sf.summary_run_code_result(crash, MAPPING) == "run-failed"

    # memory_limit_MB is honoured (and capped by the server's limit).
    hog = raw(
        sandbox_url,
        code="x = bytearray(200 * 1024 * 1024)\nprint('allocated')",
        language="python",
        memory_limit_MB=64,
    )
    assert hog.status == sf.RunStatus.Failed
    assert "MemoryError" in (hog.run_result.stderr if hog.run_result else "")


def test_an_uninstalled_language_is_answered_at_once(sandbox_url: str) -> None:
    """The client retries a SandboxError (or a non-200) five times with backoff, about 17 s;
    a language without a toolchain is a Failed run, as in Sandbox Fusion, so it does not."""
    for language in ("sql", "python2"):  # no toolchain here for either
        started = time.monotonic()
        response = sf.run_code(sf.RunCodeRequest(code="1", language=language), endpoint=sandbox_url)
        assert time.monotonic() - started < 2
        assert response.status == sf.RunStatus.Failed
        assert response.run_result is not None
        assert response.run_result.return_code == 127
        assert "installed here: python, bash" in (response.run_result.stderr or "")
        assert sf.summary_run_code_result(response, MAPPING) == "run-failed"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_absolute_file_paths_in_tmp_and_the_working_folder(sandbox_url: str) -> None:
    code = (
        "print(open('/tmp/flag.txt').read(), open('/sandbox/in/a.txt').read(),"
        " open('rel.txt').read())\n"
        "open('/tmp/out.txt', 'w').write('tmp out')\nopen('/sandbox/w.txt', 'w').write('work')"
    )
    response = client_run(
        sandbox_url,
        code=code,
        language="python",
        files={
            "/tmp/flag.txt": _b64(b"flag"),
            "/sandbox/in/a.txt": _b64(b"a"),
            "rel.txt": _b64(b"r"),
        },
        fetch_files=["/tmp/out.txt", "/sandbox/w.txt", "w.txt", "/tmp/flag.txt"],
    )
    assert response.run_result is not None
    assert response.run_result.stdout == "flag a r\n"
    assert {k: base64.b64decode(v) for k, v in response.files.items()} == {
        "/tmp/out.txt": b"tmp out",
        "/sandbox/w.txt": b"work",
        "w.txt": b"work",
        "/tmp/flag.txt": b"flag",
    }
    assert response.message == ""

    # A compiled program sees the same /tmp.
    if "cpp" in httpx.get(f"{sandbox_url}/server_info").json()["languages"]:
        cpp = client_run(
            sandbox_url,
            code='#include <fstream>\n#include <iostream>\nint main(){std::ifstream f("/tmp/n");'
            " int x; f >> x; std::cout << x + 1;}",
            language="cpp",
            files={"/tmp/n": _b64(b"41")},
        )
        assert cpp.run_result is not None and cpp.run_result.stdout == "42"


def test_escaping_paths_are_refused_and_said_so(sandbox_url: str) -> None:
    for name in ("/tmp/../etc/x", "../x", "/etc/x"):
        with pytest.raises(Exception, match="Sandbox responded with error: file path"):
            client_run(sandbox_url, code="print(1)", language="python", files={name: _b64(b"")})
    response = client_run(
        sandbox_url,
        code="print(1)",
        language="python",
        fetch_files=["/tmp/../../etc/passwd", "missing.txt"],
    )
    assert response.status == sf.RunStatus.Success
    assert response.files == {}
    assert "'/tmp/../../etc/passwd' must stay inside" in response.message
    assert "missing.txt" not in response.message  # missing: left out, as Sandbox Fusion does


def test_python_runtime_packages(sandbox_url: str) -> None:
    require_runtime_python()
    code = (
        "import numpy, pandas, scipy, sympy\nfrom scipy import linalg\n"
        "frame = pandas.DataFrame({'a': [1, 2, 3]})\n"
        "print(int(frame.a.sum()), round(float(linalg.det(numpy.eye(2) * 2))),"
        " sympy.factor(sympy.Symbol('x') ** 2 - 1))"
    )
    response = client_run(sandbox_url, code=code, language="python", run_timeout=60)
    assert response.run_result is not None
    assert response.run_result.stdout == "6 4 (x - 1)*(x + 1)\n", response.run_result.stderr


# --- verl's reward scorer -------------------------------------------------------------


@pytest.mark.slow
def test_verls_reward_scorer(sandbox_url: str) -> None:
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    url = f"{sandbox_url}/run_code"
    cases = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
    add = "a, b = map(int, input().split())\nprint(a + b)"
    results, meta = check_correctness(url, cases, add, timeout=10, language="python")
    assert results == [True, True], meta
    results, _ = check_correctness(url, cases, add.replace("+", "*"), language="python")
    assert results == [False, False]
    results, meta = check_correctness(url, cases, "raise SystemExit(1)", language="python")
    assert results == [-2, -2] and meta[0]["status"] == "runtime_error"
    results, meta = check_correctness(url, cases, "while True: pass", timeout=1, language="python")
    assert results == [-3, -3] and meta[0]["status"] == "timeout"

    if "cpp" in httpx.get(f"{sandbox_url}/server_info").json()["languages"]:
        cpp = "#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a+b<<'\\n';}"
        results, meta = check_correctness(url, cases, cpp, timeout=60, language="cpp")
        assert results == [True, True], meta
        broken = "int main() { x }"
        results, meta = check_correctness(url, cases, broken, timeout=60, language="cpp")
        assert results[0] == -4 and meta[0]["status"] == "compile_error"


def test_verls_sandbox_fusion_tool_text(sandbox_url: str) -> None:
    """verl's SandboxFusionTool.execute_code: ``_process_single_case`` with no expected
    output, then the run's stdout + stderr when it finished."""
    from verl.utils.reward_score.sandbox_fusion.utils import _process_single_case

    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)"
    _, meta = _process_single_case(
        0, None, None, f"{sandbox_url}/run_code", code, 10, 1024, "python"
    )
    assert meta["run_status"] == "Finished"
    assert meta["stdout"] + meta["stderr"] == "out\nerr\n"


def test_verl_071s_sandbox_fusion_tool_runs_this_scorer() -> None:
    """verl 0.9 dropped ``SandboxFusionTool``; its last release (0.7.1) runs code through
    ``_process_single_case`` of a scorer module byte-identical to the installed one tested
    above (read from the wheel .ci/run downloads: requirements/reference-wheels.txt)."""
    import zipfile
    from pathlib import Path

    import verl.utils.reward_score.sandbox_fusion.utils as scorer
    from tests.sandbox._support import REPO, skip_or_fail

    wheel = REPO / ".reference-wheels" / "verl-0.7.1-py3-none-any.whl"
    if not wheel.exists():
        skip_or_fail(f"verl 0.7.1's wheel is not at {wheel} (requirements/reference-wheels.txt)")
    with zipfile.ZipFile(wheel) as archive:
        tool = archive.read("verl/tools/sandbox_fusion_tools.py").decode()
        old_scorer = archive.read("verl/utils/reward_score/sandbox_fusion/utils.py")
    assert "from verl.utils.reward_score.sandbox_fusion.utils import _process_single_case" in tool
    assert 'actual_output = metadata["stdout"] + metadata["stderr"]' in tool
    assert old_scorer == Path(scorer.__file__).read_bytes()


async def test_a_missing_compiler_answers_in_compile_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sandbox Fusion runs ``g++ ...`` in a shell: without g++ the compile step exits 127
    and no run follows. The local runner answers the same, without starting anything."""
    from toolrollout._exceptions import UserError
    from toolrollout.sandbox import RunCodeRequest, _languages
    from toolrollout.sandbox._runner import SandboxRunner, SandboxServerConfig

    real = _languages.resolve_program
    monkeypatch.setattr(
        "toolrollout.sandbox._runner.resolve_program",
        lambda name, conf: None if name == "g++" else real(name, conf),
    )
    runner = SandboxRunner(SandboxServerConfig(isolation="none", max_concurrency=1))
    assert "cpp" not in runner.languages
    assert "cpp" in runner.describe()["not_installed"]
    response = await runner.run(RunCodeRequest(code="int main() {}", language="cpp"))
    parsed = sf.RunCodeResponse.parse_obj(response.model_dump())
    assert parsed.status == sf.RunStatus.Failed
    assert parsed.run_result is None
    assert parsed.compile_result is not None and parsed.compile_result.return_code == 127
    assert "the cpp toolchain (g++) is not installed" in (parsed.compile_result.stderr or "")
    assert sf.summary_run_code_result(parsed, MAPPING) == "compile-failed"

    with pytest.raises(UserError, match="unknown sandbox program"):
        SandboxRunner(SandboxServerConfig(isolation="none", programs={"gpp": "/usr/bin/g++"}))
    with pytest.raises(UserError, match="tsx=/nonexistent/tsx is not an executable"):
        SandboxRunner(SandboxServerConfig(isolation="none", programs={"tsx": "/nonexistent/tsx"}))
