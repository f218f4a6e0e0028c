"""check_drift classifies differences and never alters the transcript."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from toolrollout._exceptions import UserError
from toolrollout.chat import ChatFormat, DriftReport, check_drift

Message = dict[str, Any]

USER: Message = {"role": "user", "content": "What is 2 + 3?"}
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
CALL_MESSAGE: Message = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    ],
}
RESULT: Message = {"role": "tool", "content": "5"}
ANSWER = "The answer is 5."


@pytest.fixture
def fmt(qwen25_tokenizer: PreTrainedTokenizerBase, tools: list[Any]) -> ChatFormat:
    return ChatFormat(qwen25_tokenizer, tools=tools)


def transcript(fmt: ChatFormat, answer_ids: list[int] | None = None) -> list[int]:
    ids = fmt.render_prompt([USER])
    ids += fmt.encode(CALL_TEXT + "<|im_end|>")
    ids += fmt.tool_turn_delta([USER, CALL_MESSAGE], [RESULT])
    ids += answer_ids if answer_ids is not None else fmt.encode(ANSWER + "<|im_end|>")
    return ids


MESSAGES: list[Message] = [USER, CALL_MESSAGE, RESULT, {"role": "assistant", "content": ANSWER}]


def test_match_with_raw_texts_and_with_structured_messages(fmt: ChatFormat) -> None:
    ids = transcript(fmt)
    raw = check_drift(ids, MESSAGES, chat_format=fmt, model_texts=[CALL_TEXT, ANSWER])
    structured = check_drift(ids, MESSAGES, chat_format=fmt)
    assert raw.matches and structured.matches
    assert raw.kind == "none" and raw.first_mismatch is None and raw.expected


def test_model_texts_may_keep_the_stop_token(fmt: ChatFormat) -> None:
    ids = transcript(fmt)
    texts = [CALL_TEXT + "<|im_end|>", ANSWER + "<|im_end|>"]
    assert check_drift(ids, MESSAGES, chat_format=fmt, model_texts=texts).matches


def test_json_spacing_is_not_drift_when_raw_texts_are_given(fmt: ChatFormat) -> None:
    compact = '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'
    ids = fmt.render_prompt([USER]) + fmt.encode(compact + "<|im_end|>")
    ids += fmt.tool_turn_delta([USER, CALL_MESSAGE], [RESULT])
    ids += fmt.encode(ANSWER + "<|im_end|>")
    assert check_drift(ids, MESSAGES, chat_format=fmt, model_texts=[compact, ANSWER]).matches
    structured = check_drift(ids, MESSAGES, chat_format=fmt)
    assert structured.kind == "text"


def test_non_canonical_model_tokens_are_retokenization_drift(fmt: ChatFormat) -> None:
    # The model "sampled" the answer one character at a time: same text, other ids.
    answer_ids = [i for ch in ANSWER for i in fmt.encode(ch)] + [fmt.stop_token_ids[0]]
    assert answer_ids != fmt.encode(ANSWER + "<|im_end|>")
    ids = transcript(fmt, answer_ids)
    report = check_drift(ids, MESSAGES, chat_format=fmt, model_texts=[CALL_TEXT, ANSWER])
    assert not report.matches
    assert report.kind == "retokenization" and report.text_matches and report.expected
    assert report.first_mismatch is not None
    assert ids[report.first_mismatch] != fmt.encode(fmt.decode(ids))[report.first_mismatch]


def test_missing_boundary_is_reported_as_text_drift(fmt: ChatFormat) -> None:
    """The verl #3720 bug: dropping the template's newline after <|im_end|>."""
    delta = fmt.tool_turn_delta([USER, CALL_MESSAGE], [RESULT])
    newline = fmt.encode("\n")
    buggy = fmt.render_prompt([USER]) + fmt.encode(CALL_TEXT + "<|im_end|>")
    position = len(buggy)
    buggy += delta[len(newline) :] + fmt.encode(ANSWER + "<|im_end|>")
    report = check_drift(buggy, MESSAGES, chat_format=fmt, model_texts=[CALL_TEXT, ANSWER])
    assert report.kind == "text" and not report.expected
    assert report.first_mismatch == position
    assert report.reference_excerpt != report.transcript_excerpt
    assert "<|im_end|>\n<|im_start|>user" in report.reference_excerpt
    assert "<|im_end|><|im_start|>user" in report.transcript_excerpt


def test_transcript_ending_with_generation_prompt(fmt: ChatFormat) -> None:
    ids = fmt.render_prompt([USER]) + fmt.encode(CALL_TEXT + "<|im_end|>")
    ids += fmt.tool_turn_delta([USER, CALL_MESSAGE], [RESULT])
    report = check_drift(ids, MESSAGES[:3], chat_format=fmt, model_texts=[CALL_TEXT])
    assert report.matches


def test_never_alters_tokens(fmt: ChatFormat) -> None:
    ids = transcript(fmt)
    as_tuple = tuple(ids)
    before = list(ids)
    check_drift(ids, MESSAGES, chat_format=fmt, model_texts=[CALL_TEXT, ANSWER])
    check_drift(as_tuple, MESSAGES, chat_format=fmt)
    check_drift(ids[:-3], MESSAGES, chat_format=fmt)
    assert ids == before and list(as_tuple) == before


def test_report_is_json_ready(fmt: ChatFormat) -> None:
    ids = transcript(fmt)[:-2]
    report = check_drift(ids, MESSAGES, chat_format=fmt)
    assert isinstance(report, DriftReport)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["kind"] == report.kind == "text"
    assert data["first_mismatch"] == len(ids)


def test_more_model_texts_than_assistant_turns_is_a_user_error(fmt: ChatFormat) -> None:
    with pytest.raises(UserError, match="model_texts"):
        check_drift(transcript(fmt), MESSAGES, chat_format=fmt, model_texts=[ANSWER] * 3)


def test_model_texts_are_the_last_turns_earlier_ones_came_in_the_prompt(fmt: ChatFormat) -> None:
    """A prompt holding an assistant turn (a few-shot example, a harness's earlier
    conversation): the texts are the generated turns', and the prompt's renders as is."""
    ids = transcript(fmt)
    assert check_drift(ids, MESSAGES, chat_format=fmt, model_texts=[ANSWER]).matches
    wrong = check_drift(ids, MESSAGES, chat_format=fmt, model_texts=["Another answer."])
    assert not wrong.matches and wrong.kind == "text"


def test_render_failure_is_reported_not_raised(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    template = "{{ raise_exception('this template refuses') }}"
    broken = ChatFormat(qwen25_tokenizer, chat_template=template, family="qwen25")
    report = check_drift([1, 2, 3], MESSAGES, chat_format=broken)
    assert report.kind == "render_error" and "refuses" in report.detail
