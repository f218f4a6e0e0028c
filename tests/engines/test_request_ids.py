"""``GenerateRequest.input_ids`` is kept as a 4-byte ``array('i')``, whatever it was given,
or as the :class:`TokenRuns` (the transcript's own arrays) the rollout loop gives it.

A request holds its whole conversation while it waits for the engine; with thousands of
trajectories in flight the representation of those ids is a large part of the client's
memory (docs/benchmarks.md, "10,000 trajectories in one process").
"""

from __future__ import annotations

import json
import tracemalloc
from array import array
from dataclasses import replace
from typing import Any

import pytest

from toolrollout._exceptions import UserError
from toolrollout.engines import GenerateRequest, SamplingParams, TokenRuns
from toolrollout.engines._types import token_id_array
from toolrollout.engines._wire import encode_json, generate_body


@pytest.mark.parametrize(
    "given", [(5, 0, 151_643), [5, 0, 151_643], array("l", [5, 0, 151_643]), range(5, 6)]
)
def test_any_sequence_of_ints_becomes_an_int32_array(given: Any) -> None:
    request = GenerateRequest(input_ids=given)
    assert isinstance(request.input_ids, array) and request.input_ids.typecode == "i"
    assert list(request.input_ids) == list(given)


def test_an_int32_array_is_kept_not_copied() -> None:
    ids = array("i", [1, 2, 3])
    assert GenerateRequest(input_ids=ids).input_ids is ids


@pytest.mark.parametrize("bad", [(1, 2.5), (1, 2**40), ("7",)])
def test_ids_that_are_not_int32_are_a_one_line_user_error(bad: Any) -> None:
    with pytest.raises(UserError, match=r"^GenerateRequest\.input_ids: ") as raised:
        GenerateRequest(input_ids=bad)
    assert "\n" not in str(raised.value)


def test_the_body_writes_the_array_as_a_json_list() -> None:
    request = GenerateRequest(input_ids=[151_644, 8948, 198], sampling=SamplingParams())
    body = json.loads(encode_json(generate_body(request, "r1")))
    assert body["input_ids"] == [151_644, 8948, 198]


def _runs() -> TokenRuns:
    return TokenRuns([array("i", [7, 8, 9]), array("i"), array("i", [10]), array("i", [11, 12])])


def test_token_runs_read_as_one_sequence() -> None:
    ids = _runs()
    flat = [7, 8, 9, 10, 11, 12]
    assert len(ids) == 6 and list(ids) == flat and ids.tolist() == flat
    assert [ids[i] for i in range(-6, 6)] == flat + flat
    assert ids[1:5] == array("i", [8, 9, 10, 11]) and ids[::-2].tolist() == [12, 10, 8]
    assert ids.tobytes() == array("i", flat).tobytes() and ids.joined() == array("i", flat)
    assert 10 in ids and ids.index(11) == 4 and ids.count(9) == 1
    with pytest.raises(IndexError):
        ids[6]
    with pytest.raises(IndexError):
        ids[-7]
    assert len(TokenRuns([])) == 0 and list(TokenRuns([array("i")])) == []


def test_token_runs_compare_like_an_array() -> None:
    ids = _runs()
    assert ids == array("i", [7, 8, 9, 10, 11, 12]) and array("i", [7, 8, 9, 10, 11, 12]) == ids
    assert ids == TokenRuns([array("i", [7, 8, 9, 10, 11, 12])])
    assert ids != array("i", [7, 8, 9, 10, 11]) and ids != array("i", [7, 8, 9, 10, 11, 13])
    assert ids != [7, 8, 9, 10, 11, 12] and ids != (7, 8, 9, 10, 11, 12)
    with pytest.raises(TypeError):
        hash(ids)


def test_token_runs_take_only_int32_arrays() -> None:
    with pytest.raises(UserError, match="TokenRuns: every run must be an array"):
        TokenRuns([array("i", [1]), [2, 3]])  # type: ignore[list-item]
    with pytest.raises(UserError, match="array"):
        TokenRuns([array("l", [1])])


def test_a_request_keeps_its_runs_and_sends_them_joined() -> None:
    ids = _runs()
    request = GenerateRequest(input_ids=ids)
    assert request.input_ids is ids
    assert replace(request, priority=3).input_ids is ids  # a scheduler's copy shares them too
    assert generate_body(request, "r")["input_ids"] == [7, 8, 9, 10, 11, 12]
    joined = token_id_array(ids)
    assert joined == ids and isinstance(joined, array) and joined.typecode == "i"


def test_an_encoded_body_keeps_only_its_own_size() -> None:
    """orjson allocates far more than it writes (about 35 times for 1,000 ids); the body
    waits as long as the server works, so what it keeps must be the body's own size."""
    request = GenerateRequest(input_ids=array("i", range(100_000, 101_000)))
    body = generate_body(request, "r")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        encoded = encode_json(body)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert json.loads(encoded)["input_ids"] == list(range(100_000, 101_000))
    assert len(encoded) < kept < len(encoded) + 512
