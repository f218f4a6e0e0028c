"""The search tools' text is verl's, character for character, checked by running verl's own
code (``verl/tools/utils/search_r1_like_utils.py`` of verl 0.7.1, the module behind verl's
``SearchTool.execute``) against the same retriever answers.

verl 0.9 dropped its search tool and the project's verl is 0.9.1, so the module is read out
of the verl 0.7.1 wheel that .ci/run downloads (requirements/reference-wheels.txt) and loaded
under a private name; it needs only the standard library and ``requests``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from toolrollout.search import SearchTool, VerlSearchTool
from toolrollout.tools import ToolContext

REPO = Path(__file__).resolve().parents[2]
WHEEL = Path(
    os.environ.get(
        "TOOLROLLOUT_VERL_071_WHEEL", REPO / ".reference-wheels" / "verl-0.7.1-py3-none-any.whl"
    )
)
MODULE = "verl/tools/utils/search_r1_like_utils.py"


@pytest.fixture(scope="module")
def verl_search() -> ModuleType:
    if not WHEEL.exists():
        message = (
            f"verl 0.7.1's wheel is not at {WHEEL}: pip download --no-deps --require-hashes "
            "-r requirements/reference-wheels.txt -d .reference-wheels"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so this is an error, not a skip)")
        pytest.skip(message)
    with zipfile.ZipFile(WHEEL) as wheel:
        source = wheel.read(MODULE).decode("utf-8")
    name = "verl071_search_r1_like_utils"
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{WHEEL}/{MODULE}", "exec"), module.__dict__)
    sys.modules[name] = module
    return module


class _Canned(BaseHTTPRequestHandler):
    """Answers every POST with the server's current canned body."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        body = json.dumps(self.server.answer).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def canned() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join(5)


def _hit(contents: str, score: float = 1.0, doc_id: str = "d") -> dict[str, Any]:
    return {"document": {"id": doc_id, "contents": contents}, "score": score}


ANSWERS: dict[str, list[list[dict[str, Any]]]] = {
    "one hit": [[_hit('"Emu"\nA large flightless bird.')]],
    "no hits": [[]],
    "no hits among others": [[_hit('"A"\na')], [], [_hit('"B"\nb'), _hit('"C"\nc')]],
    "all empty": [[], []],
    "title only": [[_hit('"Lonely title"')]],
    "multi-line body, blank lines, trailing spaces": [
        [_hit('"T"\nline one\n\nline three  \n\n'), _hit("  no quotes\n  indented\n")]
    ],
    "non-ascii": [[_hit('"Zürich"\nStadt am See — 湖')]],
    "empty contents": [[_hit("")]],
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
async def test_text_is_verls(
    case: str, verl_search: ModuleType, canned: ThreadingHTTPServer
) -> None:
    answer = {"result": ANSWERS[case]}
    canned.answer = answer  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{canned.server_address[1]}/retrieve"
    queries = [f"q{i}" for i in range(len(answer["result"]))]

    verl_text, metadata = verl_search.perform_single_search_batch(url, queries, topk=3)
    assert metadata["status"] == "success", metadata

    verl_tool = VerlSearchTool(retrieval_service_url=url, topk=3)
    mine = await verl_tool.call({"query_list": queries}, ToolContext())
    assert not mine.is_error, mine.text
    assert mine.text == verl_text  # SearchTool.execute returns this text unchanged

    plain = SearchTool(retrieval_service_url=url, topk=3)
    mine_plain = await plain.call({"query_list": queries}, ToolContext())
    assert mine_plain.text == json.loads(verl_text)["result"]
    assert mine.metrics["total_results"] == metadata["total_results"]


async def test_real_retriever_text_is_verls(verl_search: ModuleType, retriever_url: str) -> None:
    queries = ["capital of Ostonia", "Who invented the Nyxine loom?", "xyzzy plugh"]
    verl_text, _ = verl_search.perform_single_search_batch(retriever_url, queries, topk=3)
    mine = await VerlSearchTool(retrieval_service_url=retriever_url, topk=3).call(
        {"query_list": queries}, ToolContext()
    )
    assert mine.text == verl_text
    assert json.loads(verl_text)["result"].endswith("\n---\n")  # the last query: no hits
