"""``GenerateRequest.input_ids`` is kept as a 4-byte ``array('i')``, whatever it was given.

A request holds its whole conversation while it waits for the engine; with thousands of
trajectories in flight the representation of those ids is a large part of the client's
memory (docs/benchmarks.md, "10,000 trajectories in one process").
"""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest

from toolrollout._exceptions import UserError
from toolrollout.engines import GenerateRequest, SamplingParams
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
