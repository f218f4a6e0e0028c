"""How the suite is cut into units for its two pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import xdist_unit


def test_a_module_is_one_unit() -> None:
    assert xdist_unit("tests/server/test_server.py::test_a") == "tests/server/test_server.py"
    assert xdist_unit("tests/server/test_server.py::TestX::test_b[1]") == (
        "tests/server/test_server.py"
    )


def test_each_documentation_page_is_its_own_unit() -> None:
    quickstart = "tests/docs/test_docs_run.py::test_page_runs_as_written[docs/quickstart.md]"
    readme = "tests/docs/test_docs_run.py::test_page_runs_as_written[README.md]"
    assert xdist_unit(quickstart) == quickstart and xdist_unit(readme) == readme
    # the docs module's other tests stay together
    assert xdist_unit("tests/docs/test_docs_run.py::test_commands_are_fenced_as_code") == (
        "tests/docs/test_docs_run.py"
    )


def test_everything_that_starts_ray_is_one_unit() -> None:
    page = "tests/docs/test_docs_run.py::test_page_runs_as_written[docs/scale-out.md]"
    units = {
        xdist_unit(page),
        xdist_unit("tests/distributed/test_ray_generate.py::test_x"),
        xdist_unit("tests/distributed/test_ray_keys.py::test_y"),
        xdist_unit("tests/faults/test_chaos_ray_serve.py::test_z"),
        xdist_unit("tests/real_engines/vllm/test_ray.py::test_w"),
    }
    assert units == {"ray"}


def test_the_real_sglang_tests_are_one_unit() -> None:
    """They share one session-scoped SGLang server, started once on one worker."""
    units = {
        xdist_unit("tests/real_engines/sglang/test_generate.py::test_a"),
        xdist_unit("tests/real_engines/sglang/test_control.py::test_b[x]"),
    }
    assert units == {"tests/real_engines/sglang/"}
    assert xdist_unit("tests/engines/test_sglang_client.py::test_c") != units.pop()
    vllm = {
        xdist_unit("tests/real_engines/vllm/test_vllm_engine.py::test_a"),
        xdist_unit("tests/real_engines/vllm/test_vllm_rollouts.py::test_b"),
    }
    assert vllm == {"tests/real_engines/vllm/"}
