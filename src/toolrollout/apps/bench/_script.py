"""The latency-model server's "model": scripted tool-calling turns in real token ids.

Each turn is rendered as text the way the demo chat template writes an assistant turn
(Qwen2.5 tool-call format) and tokenized in context with the served tokenizer, so the ids
re-render exactly and the client's parser, deltas and drift check do real work. Token ids
are always derived from the tokenizer, never hard-coded.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from toolrollout.engines._types import FinishReason, SamplingParams

from ._model import WorkloadGroup, WorkloadItem, parse_directive, parse_group_directive

__all__ = ["TOOL_NAME", "TurnScript"]

TOOL_NAME = "lookup"
"""The one tool the scripted model calls (served by the benchmark's tool service)."""
_WORDS = (
    "checking the record before answering",
    "the next value comes from the lookup service",
    "noting the intermediate result",
)


class TurnScript:
    """Finds a request's script and turn index in its ids and writes the next turn."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(start, int) or not isinstance(end, int) or start == end:
            raise ValueError("the tokenizer has no <|im_start|>/<|im_end|> tokens")
        self.im_start: int = start
        self.im_end: int = end
        self._user_header = self._encode("<|im_start|>user\n")
        self._assistant_header = self._encode("<|im_start|>assistant\n")
        self._filler: dict[int, str] = {}
        self._drawn: Counter[str] = Counter()
        """First turns seen per shared-prompt group: the next one is that sample."""

    def reset(self) -> None:
        """Forget which samples of the shared-prompt groups were drawn (between modes)."""
        self._drawn.clear()

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    # ------------------------------------------------------------------ reading requests
    def locate(self, ids: Sequence[int]) -> tuple[WorkloadItem | WorkloadGroup | None, int, int]:
        """(script, turn index, end of the shared system prefix) for a token prompt.

        A shared-prompt group's first turn gives the group itself: which sample it is gets
        drawn by the caller (:meth:`draw`, or one draw shared by several servers).
        """
        header = self._user_header
        width = len(header)
        pos = -1
        try:
            at = ids.index(self.im_start)
            while True:
                if list(ids[at : at + width]) == header:
                    pos = at
                    break
                at = ids.index(self.im_start, at + 1)
        except ValueError:
            return None, 0, 0
        try:
            end = ids.index(self.im_end, pos)
        except ValueError:
            return None, 0, pos
        text = self._tok.decode(list(ids[pos + width : end]))
        before = list(ids[: pos + 1]).count(self.im_start)
        # Each finished turn adds its assistant header and the tool turn's header; the
        # generation prompt adds one more.
        turn = max((list(ids).count(self.im_start) - before - 1) // 2, 0)
        group = parse_group_directive(text)
        if group is None:
            return parse_directive(text), turn, pos
        if turn == 0:
            return group, turn, pos
        return self._sample_of(group, ids, end), turn, pos

    def draw(self, group: WorkloadGroup) -> WorkloadItem:
        """The sample a shared-prompt group's next first turn is: the k-th one is sample k.

        A first turn sent again (a retry, or one continued after an abort) draws again:
        the benchmark runs neither.
        """
        index = self._drawn[group.key] % len(group.turns)
        self._drawn[group.key] += 1
        return group.sample(index)

    def _sample_of(
        self, group: WorkloadGroup, ids: Sequence[int], prompt_end: int
    ) -> WorkloadItem | None:
        """Which sample of a shared-prompt group a later turn belongs to: read back from its
        first answer's tool call."""
        try:
            start = ids.index(self.im_start, prompt_end)
            stop = ids.index(self.im_end, start + 1)
        except ValueError:
            return None
        first_answer = self._tok.decode(list(ids[start:stop]))
        match = re.search(rf'"key": "{re.escape(group.key)}s(\d+)\.0"', first_answer)
        if match is None or int(match[1]) >= len(group.turns):
            return None
        return group.sample(int(match[1]))

    # ------------------------------------------------------------------ writing answers
    def turn(self, item: WorkloadItem | None, turn: int) -> str:
        """The assistant text (no end-of-turn token) of model turn ``turn`` (0-based): a call
        of the tool keyed ``<item>.<turn>``, or at the last turn the final answer."""
        if item is None:
            return "There is no benchmark script in this prompt."
        if turn < item.turns - 1:
            call = json.dumps({"name": TOOL_NAME, "arguments": {"key": f"{item.key}.{turn}"}})
            tail = f"\n<tool_call>\n{call}\n</tool_call>"
        else:
            tail = f" Done with {item.key}."
        return self._fill(item.tokens, tail) + tail

    def output_ids(self, text: str) -> list[int]:
        """Ids of ``text`` as an assistant turn, the end-of-turn token included."""
        ids = self._encode("<|im_start|>assistant\n" + text + "<|im_end|>")
        head = self._assistant_header
        if ids[: len(head)] != head:
            raise ValueError("the assistant header does not tokenize on its own")
        return ids[len(head) :]

    def answer(self, text: str, sampling: SamplingParams) -> tuple[list[int], FinishReason]:
        """The ids a server answers ``text`` with under ``sampling``, and why they end."""
        output = self.output_ids(text)
        max_new = sampling.max_new_tokens
        if sampling.ignore_eos:  # SGLang decodes max_new_tokens whatever it samples
            output = (output * (max_new // max(len(output), 1) + 1))[:max_new] or [0] * max_new
        if len(output) > max_new or sampling.ignore_eos:
            return output[:max_new], FinishReason("length", length=max_new)
        return output, FinishReason("stop", matched=self.im_end)

    def _fill(self, tokens: int, tail: str) -> str:
        """Filler words so that the turn has about ``tokens`` tokens in all."""
        budget = tokens - len(self._encode(tail)) - 1
        if budget <= 0:
            return "Ok."
        cached = self._filler.get(budget)
        if cached is not None:
            return cached
        words: list[str] = []
        i = 0
        while len(self._encode(" ".join(words))) < budget:
            words.extend(_WORDS[i % len(_WORDS)].split())
            i += 1
        while len(words) > 1 and len(self._encode(" ".join(words))) > budget:
            words.pop()
        text = " ".join(words).capitalize() + "."
        self._filler[budget] = text
        return text
