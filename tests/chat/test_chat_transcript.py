"""Token transcripts built turn by turn equal a fresh render of the final conversation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from toolrollout.chat import ChatFormat, check_drift

Message = dict[str, Any]


@dataclass
class Turn:
    """One model turn and the environment messages that answer it."""

    message: Message
    """The assistant message as the rollout stores it (parsed tool calls)."""
    text: str
    """What the model emitted, without the stop token."""
    env: list[Message] = field(default_factory=list)
    """Tool results (or a user follow-up) appended after the turn."""


@dataclass
class Transcript:
    ids: list[int]
    loss_mask: list[int]
    messages: list[Message]
    prompt: list[int]
    deltas: list[list[int]]
    model_texts: list[str]


def build(fmt: ChatFormat, prompt_messages: Sequence[Message], turns: Sequence[Turn]) -> Transcript:
    """Build a transcript the way a rollout does: prompt once, model ids verbatim, deltas."""
    tokenizer = fmt.tokenizer
    prompt = fmt.render_prompt(prompt_messages)
    ids = list(prompt)
    mask = [0] * len(prompt)
    messages = list(prompt_messages)
    deltas: list[list[int]] = []
    for turn in turns:
        stop = fmt.family.stop_tokens[0]
        output_ids = tokenizer.encode(turn.text + stop, add_special_tokens=False)
        assert fmt.ends_with_stop(output_ids)
        ids += output_ids
        mask += [1] * len(output_ids)
        messages.append(turn.message)
        if turn.env:
            delta = fmt.tool_turn_delta(messages, turn.env)
            deltas.append(delta)
            ids += delta
            mask += [0] * len(delta)
            messages.extend(turn.env)
    return Transcript(ids, mask, messages, prompt, deltas, [t.text for t in turns])


def call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


USER: Message = {"role": "user", "content": "What is 2 + 3? Also, what is the weather in Paris?"}


def qwen_turns() -> list[Turn]:
    """user -> assistant (two calls) -> two tool results -> assistant answer."""
    first_text = (
        "Let me compute that.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    first = {
        "role": "assistant",
        "content": "Let me compute that.",
        "tool_calls": [
            call("add", {"a": 2, "b": 3}, "call_0"),
            call("get_weather", {"city": "Paris"}, "call_1"),
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": "call_0", "content": "5"},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]
    answer_text = "2 + 3 = 5, and it is sunny in Paris."
    answer = {"role": "assistant", "content": answer_text}
    return [Turn(first, first_text, results), Turn(answer, answer_text)]


def llama_turns() -> list[Turn]:
    first_text = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    first = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("add", {"a": 2, "b": 3}, "call_0")],
    }
    second_text = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    second = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("get_weather", {"city": "Paris"}, "call_1")],
    }
    answer_text = "2 + 3 = 5, and it is sunny in Paris."
    return [
        Turn(first, first_text, [{"role": "tool", "tool_call_id": "call_0", "content": "5"}]),
        Turn(
            second,
            second_text,
            [{"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}],
        ),
        Turn({"role": "assistant", "content": answer_text}, answer_text),
    ]


def render_final(fmt: ChatFormat, messages: Sequence[Message]) -> str:
    return fmt.render_text(messages, add_generation_prompt=False)


# -- Qwen2.5 ------------------------------------------------------------------------------


@pytest.fixture
def qwen25(qwen25_tokenizer: PreTrainedTokenizerBase, tools: list[Any]) -> ChatFormat:
    return ChatFormat(qwen25_tokenizer, tools=tools)


def test_qwen25_transcript_equals_fresh_render(qwen25: ChatFormat) -> None:
    transcript = build(qwen25, [USER], qwen_turns())
    fresh = render_final(qwen25, transcript.messages)
    # The model's last turn ends at <|im_end|>; the template's "\n" after it is the
    # boundary the next delta would carry.
    assert qwen25.decode(transcript.ids) + "\n" == fresh
    # Qwen2.5 is prefix-stable, so equality holds token for token as well.
    assert transcript.ids == qwen25.encode(fresh[:-1])
    report = check_drift(
        transcript.ids, transcript.messages, chat_format=qwen25, model_texts=transcript.model_texts
    )
    assert report.matches and report.kind == "none"


def test_qwen25_newline_boundary_lands_in_the_delta(qwen25: ChatFormat) -> None:
    transcript = build(qwen25, [USER], qwen_turns())
    (delta,) = transcript.deltas
    newline = qwen25.encode("\n")
    assert delta[: len(newline)] == newline
    text = qwen25.decode(delta)
    assert text.startswith("\n<|im_start|>user\n<tool_response>\n5\n</tool_response>")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # The model's own ids stop at <|im_end|> and never contain the boundary.
    end_id = qwen25.stop_token_ids[0]
    model_end = transcript.ids.index(end_id, len(transcript.prompt))
    assert transcript.ids[model_end + 1 : model_end + 1 + len(newline)] == newline
    assert transcript.loss_mask[model_end] == 1
    assert transcript.loss_mask[model_end + 1] == 0


def test_qwen25_consecutive_tool_messages_merge_into_one_user_turn(qwen25: ChatFormat) -> None:
    transcript = build(qwen25, [USER], qwen_turns())
    text = qwen25.decode(transcript.deltas[0])
    assert text.count("<|im_start|>") == 2  # one user turn + the generation prompt
    assert text.count("<tool_response>") == 2
    assert "</tool_response>\n<tool_response>\nSunny, 21 C\n</tool_response><|im_end|>" in text


def test_prompt_ids_never_change_and_are_tokenized_once(
    qwen25: ChatFormat, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = qwen25.tokenizer
    encoded: list[str] = []
    original = type(tokenizer).encode

    def spy(self: Any, text: str, *args: Any, **kwargs: Any) -> Any:
        encoded.append(text)
        return original(self, text, *args, **kwargs)

    prompt = qwen25.render_prompt([USER])
    snapshot = list(prompt)
    monkeypatch.setattr(type(tokenizer), "encode", spy)
    transcript = build(qwen25, [USER], qwen_turns())
    monkeypatch.undo()
    assert transcript.ids[: len(snapshot)] == snapshot == transcript.prompt
    # After the prompt, only model texts (test setup) and delta suffixes were tokenized:
    # nothing that contains the system turn or the user's question again.
    after_prompt = encoded[1:]
    assert after_prompt
    assert not any("# Tools" in text or USER["content"] in text for text in after_prompt)


def test_user_follow_up_is_a_delta_too(qwen25: ChatFormat) -> None:
    turns = qwen_turns()
    turns[-1].env = [{"role": "user", "content": "Thanks! And 4 + 4?"}]
    transcript = build(qwen25, [USER], turns)
    text = qwen25.decode(transcript.deltas[-1])
    assert text == "\n<|im_start|>user\nThanks! And 4 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert qwen25.decode(transcript.ids) == qwen25.render_text(
        transcript.messages, add_generation_prompt=True
    )


# -- Qwen3 --------------------------------------------------------------------------------


def qwen3_turns(*, second_query: bool) -> list[Turn]:
    think_call = (
        "<think>\nI need the calculator for this.\n</think>\n\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    turns = [
        Turn(
            {
                "role": "assistant",
                "content": "<think>\nI need the calculator for this.\n</think>\n\n",
                "tool_calls": [call("add", {"a": 2, "b": 3}, "call_0")],
            },
            think_call,
            [{"role": "tool", "tool_call_id": "call_0", "content": "5"}],
        ),
    ]
    answer = "<think>\nThe tool said 5.\n</think>\n\n2 + 3 = 5."
    if not second_query:
        turns.append(Turn({"role": "assistant", "content": answer}, answer))
        return turns
    turns.append(
        Turn(
            {"role": "assistant", "content": answer},
            answer,
            [{"role": "user", "content": "And the weather in Paris?"}],
        )
    )
    weather = (
        "<think>\nAsk the weather tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    turns.append(
        Turn(
            {
                "role": "assistant",
                "content": "<think>\nAsk the weather tool.\n</think>\n\n",
                "tool_calls": [call("get_weather", {"city": "Paris"}, "call_1")],
            },
            weather,
            [
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
                {"role": "tool", "tool_call_id": "call_1", "content": "UV index 3"},
            ],
        )
    )
    final = "<think>\nReport it.\n</think>\n\nIt is sunny in Paris."
    turns.append(Turn({"role": "assistant", "content": final}, final))
    return turns


@pytest.fixture
def qwen3(qwen3_tokenizer: PreTrainedTokenizerBase, tools: list[Any]) -> ChatFormat:
    return ChatFormat(qwen3_tokenizer, tools=tools)


def test_qwen3_single_query_is_prefix_stable(qwen3: ChatFormat) -> None:
    assert qwen3.family.name == "qwen3"
    transcript = build(qwen3, [USER], qwen3_turns(second_query=False))
    fresh = render_final(qwen3, transcript.messages)
    assert qwen3.decode(transcript.ids) + "\n" == fresh
    assert transcript.ids == qwen3.encode(fresh[:-1])


def test_qwen3_think_stripping_is_kept_out_of_the_transcript(
    qwen3: ChatFormat, qwen3_tokenizer: PreTrainedTokenizerBase, tools: list[Any]
) -> None:
    transcript = build(qwen3, [USER], qwen3_turns(second_query=True))
    keep = ChatFormat(qwen3_tokenizer, tools=tools, template_kwargs={"keep_past_thinking": True})
    kept = keep.render_text(transcript.messages, add_generation_prompt=False)
    stripped = render_final(qwen3, transcript.messages)
    assert kept != stripped
    assert "I need the calculator" in kept and "I need the calculator" not in stripped
    # The transcript holds what the model saw: every think block, as generated.
    assert qwen3.decode(transcript.ids) + "\n" == kept
    assert transcript.ids == qwen3.encode(kept[:-1])
    # The merged tool turn still holds both results.
    assert qwen3.decode(transcript.deltas[-1]).count("<tool_response>") == 2

    report = check_drift(
        transcript.ids, transcript.messages, chat_format=qwen3, model_texts=transcript.model_texts
    )
    assert not report.matches
    assert report.kind == "history_rewrite"
    assert report.expected
    assert report.first_mismatch is not None
    assert "<think>" in report.transcript_excerpt
    assert "I need the calculator" not in report.reference_excerpt


def test_qwen3_enable_thinking_false_lands_in_prompt_and_delta(
    qwen3_tokenizer: PreTrainedTokenizerBase, tools: list[Any]
) -> None:
    fmt = ChatFormat(qwen3_tokenizer, tools=tools, template_kwargs={"enable_thinking": False})
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert fmt.decode(fmt.render_prompt([USER])).endswith(empty_think)
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    message = {"role": "assistant", "content": text}
    result = {"role": "tool", "content": "5"}
    # A final assistant turn gets an empty think block that disappears once it is no
    # longer last, so "render without, render with, diff the prefix" would fail here.
    without = fmt.render_text([USER, message], add_generation_prompt=False)
    with_result = fmt.render_text([USER, message, result], add_generation_prompt=True)
    assert not with_result.startswith(without)
    delta = fmt.tool_turn_delta([USER, message], [result])
    assert fmt.decode(delta).startswith("\n<|im_start|>user\n<tool_response>")
    assert fmt.decode(delta).endswith(empty_think)


# -- Llama 3 ------------------------------------------------------------------------------


@pytest.fixture
def llama3(llama3_tokenizer: PreTrainedTokenizerBase, tools: list[Any]) -> ChatFormat:
    return ChatFormat(llama3_tokenizer, tools=tools)


def test_llama3_transcript_equals_fresh_render(llama3: ChatFormat) -> None:
    assert llama3.family.name == "llama3"
    transcript = build(llama3, [USER], llama_turns())
    fresh = render_final(llama3, transcript.messages)
    assert fresh.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert llama3.decode(transcript.ids) == fresh
    assert transcript.ids == llama3.encode(fresh)
    report = check_drift(
        transcript.ids, transcript.messages, chat_format=llama3, model_texts=transcript.model_texts
    )
    assert report.matches


def test_llama3_has_no_boundary_after_eot(llama3: ChatFormat) -> None:
    transcript = build(llama3, [USER], llama_turns())
    for delta in transcript.deltas:
        text = llama3.decode(delta)
        assert text.startswith("<|start_header_id|>ipython<|end_header_id|>\n\n")
        assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama3.decode(transcript.deltas[0]).count("ipython") == 1


def test_llama3_eom_turn_end_is_a_benign_rewrite(llama3: ChatFormat) -> None:
    turns = llama_turns()
    transcript = build(llama3, [USER], turns)
    eot, eom = llama3.stop_token_ids
    first_end = transcript.ids.index(eot, len(transcript.prompt))
    ids = list(transcript.ids)
    ids[first_end] = eom  # the model ended its call turn with <|eom_id|>
    report = check_drift(
        ids, transcript.messages, chat_format=llama3, model_texts=transcript.model_texts
    )
    assert report.kind == "history_rewrite" and report.first_mismatch == first_end


def test_llama3_tool_messages_are_one_turn_each(llama3: ChatFormat) -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [call("add", {"a": 1, "b": 1}, "c0"), call("add", {"a": 2, "b": 2}, "c1")],
    }
    results = [{"role": "tool", "content": "2"}, {"role": "tool", "content": "4"}]
    text = llama3.decode(llama3.tool_turn_delta([USER, message], results))
    assert text.count("<|start_header_id|>ipython<|end_header_id|>") == 2


# -- the demo model's template (a teammate's file; skipped when absent) ------------------


def test_demo_template_is_qwen25_and_extends_cleanly(
    qwen25_tokenizer: PreTrainedTokenizerBase, tools: list[Any]
) -> None:
    from pathlib import Path

    import toolrollout

    path = Path(next(iter(toolrollout.__path__))) / "apps" / "demo" / "chat_template.jinja"
    assert path.is_file(), f"the demo chat template is committed at {path}"
    fmt = ChatFormat(qwen25_tokenizer, tools=tools, chat_template=path.read_text())
    assert fmt.family.name == "qwen25"
    transcript = build(fmt, [USER], qwen_turns())
    fresh = render_final(fmt, transcript.messages)
    assert fmt.decode(transcript.ids) + "\n" == fresh
    assert transcript.ids == fmt.encode(fresh[:-1])


def test_demo_model_tokenizer() -> None:
    from pathlib import Path

    import toolrollout

    model_dir = Path(next(iter(toolrollout.__path__))) / "apps" / "demo" / "model"
    assert (model_dir / "tokenizer_config.json").is_file(), (
        f"the demo model is committed at {model_dir}"
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    fmt = ChatFormat(tokenizer, tools=[])
    prompt = fmt.render_prompt([USER])
    message = {"role": "assistant", "content": "The answer is 5."}
    delta = fmt.tool_turn_delta([USER, message], [{"role": "tool", "content": "5"}])
    assert fmt.decode(delta).startswith(fmt.family.boundary)
    assert prompt == fmt.render_prompt([USER])
