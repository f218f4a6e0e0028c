"""Template families: detection, boundary rules, and ChatFormat's guard rails."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from toolrollout._exceptions import TokenizationError, UserError
from toolrollout.chat import ChatFormat, template_families
from toolrollout.chat.families import detect_template_family, get_template_family
from toolrollout.chat.parsers import get_tool_parser

TEMPLATES = Path(__file__).parent / "templates"
USER = {"role": "user", "content": "What is 2 + 3?"}
ANSWER = {"role": "assistant", "content": "The answer is 5."}
RESULT = {"role": "tool", "content": "5"}


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
def test_detects_each_test_template(name: str) -> None:
    assert detect_template_family((TEMPLATES / f"{name}.jinja").read_text()).name == name


def test_unknown_template_asks_for_a_family() -> None:
    with pytest.raises(UserError, match="family="):
        detect_template_family("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_family_registry_documents_boundaries() -> None:
    families = template_families()
    assert {"llama3", "mistral", "qwen25", "qwen3"} <= set(families)
    assert {"qwen3_coder", "qwen35", "qwen25_vl", "qwen3_vl"} <= set(families)
    assert {"llama3", "qwen25", "qwen3", "deepseekv3", "deepseekv31", "kimi_k2", "glm45"} <= set(
        families
    )
    assert families["qwen25"].boundary == "\n" == families["qwen3"].boundary
    assert families["llama3"].boundary == ""
    assert families["qwen3"].rewrites_history and not families["qwen25"].rewrites_history
    for family in families.values():
        get_tool_parser(family.tool_parser)  # every default parser is registered
    with pytest.raises(UserError, match="unknown model family"):
        get_template_family("nope")


def test_family_given_by_name_overrides_detection(
    qwen3_tokenizer: PreTrainedTokenizerBase,
) -> None:
    assert ChatFormat(qwen3_tokenizer, family="qwen25").family.name == "qwen25"


def test_stop_token_must_exist_in_the_tokenizer(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    with pytest.raises(TokenizationError, match=re.escape("<|eot_id|>")):
        ChatFormat(qwen25_tokenizer, family="llama3")


def test_boundary_mismatch_means_wrong_family(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    wrong = replace(get_template_family("qwen25"), name="chatml-no-newline", boundary="")
    fmt = ChatFormat(qwen25_tokenizer, family=wrong)
    with pytest.raises(TokenizationError, match="documents"):
        fmt.tool_turn_delta([USER, ANSWER], [RESULT])


def test_reserved_template_kwargs_are_refused(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    with pytest.raises(UserError, match="add_generation_prompt"):
        ChatFormat(qwen25_tokenizer, template_kwargs={"add_generation_prompt": False})


def test_missing_chat_template_is_a_user_error(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    import copy

    bare = copy.deepcopy(qwen25_tokenizer)
    bare.chat_template = None
    with pytest.raises(UserError, match="chat template"):
        ChatFormat(bare)


@pytest.mark.parametrize(
    ("before", "new", "match"),
    [
        ([USER], [RESULT], "must end with the assistant turn"),
        ([USER, ANSWER], [], "empty"),
        ([USER, ANSWER], [RESULT, ANSWER], "must not contain assistant"),
    ],
)
def test_delta_argument_checks(
    qwen25_tokenizer: PreTrainedTokenizerBase,
    before: list[dict[str, Any]],
    new: list[dict[str, Any]],
    match: str,
) -> None:
    fmt = ChatFormat(qwen25_tokenizer)
    with pytest.raises(UserError, match=match):
        fmt.tool_turn_delta(before, new)


def test_model_text_and_stop_detection(llama3_tokenizer: PreTrainedTokenizerBase) -> None:
    fmt = ChatFormat(llama3_tokenizer)
    eot, eom = fmt.stop_token_ids
    ids = [*fmt.encode('{"name": "add", "parameters": {}}'), eom]
    assert fmt.ends_with_stop(ids) and not fmt.ends_with_stop(ids[:-1])
    assert not fmt.ends_with_stop([])
    assert fmt.model_text(ids) == '{"name": "add", "parameters": {}}'
    assert fmt.model_text([*fmt.encode("hi"), eot]) == "hi"


def test_template_error_becomes_tokenization_error(
    qwen25_tokenizer: PreTrainedTokenizerBase,
) -> None:
    fmt = ChatFormat(qwen25_tokenizer, chat_template="{{ raise_exception('no') }}", family="qwen25")
    with pytest.raises(TokenizationError, match="failed to render"):
        fmt.render_prompt([USER])
    with pytest.raises(UserError, match="empty"):
        fmt.render_prompt([])
