"""How an episode's messages become the token stream a policy reads: the first prompt, and the
environment's text between the policy's turns.

A row of a multi-turn episode is one stream of ids [L]: the prompt, the policy's first turn (up
to and including its eos), the environment's text (the tool responses and the next generation
prompt), the policy's second turn, and so on. The policy's tokens are kept exactly as sampled;
only the environment's parts are rendered, here:

- TemplateChat: a released model's chat template (tasks/hf_tokenizer.py). Qwen3 renders a "tool"
  message as ``<|im_start|>user\n<tool_response>\n...\n</tool_response><|im_end|>``, and the tools
  header in the system prompt. The environment's text is what the template writes after the
  policy's turn: the conversation is rendered with a sentinel in place of the policy's text, and
  what follows the sentinel's end-of-turn token is taken. (Rendering the whole conversation again
  would not do: Qwen3's template drops an empty think block from an assistant turn once a message
  follows it, so the text of earlier turns is not stable; the sentinel needs only what comes
  after the turn.)
- PlainChat: the character-level tasks' format: the prompt is bos + the user's text, a tool
  response is ``<tool_response>...</tool_response>`` right after the policy's eos.

Dimension legend: L = number of tokens in one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

Message = Mapping[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str}
_SENTINEL = "\x00POLICY-TURN\x00"


class ChatFormat(Protocol):
    """The rendering an environment's episodes use; ``tokenizer`` encodes what it renders."""

    tokenizer: Any

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Mapping]) -> list[int]:
        """The first prompt [L], through the generation prompt of the policy's first turn."""
        ...

    def observation_ids(
        self, history: Sequence[Message], observation: Sequence[Message]
    ) -> list[int]:
        """The environment's ids [L] after the policy's turn (``history`` ends with it) through
        the next generation prompt."""
        ...


class TemplateChat:
    """A checkpoint's chat template (HFTokenizer); ``enable_thinking`` as Qwen3's switch."""

    def __init__(self, tokenizer, *, enable_thinking: bool | None = False):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"{tokenizer!r} has no chat template; use PlainChat for character-level tasks."
            )
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.end_of_turn = tokenizer.special_tokens.get("eos_token", "")
        if not self.end_of_turn:
            raise ValueError(f"{tokenizer!r} names no eos token, which ends the policy's turns.")

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Mapping]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) or None,
            add_generation_prompt=True,
            enable_thinking=self.enable_thinking,
        )
        return self.tokenizer.encode(text)

    def observation_text(self, history: Sequence[Message], observation: Sequence[Message]) -> str:
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("observation_text needs a history that ends with the policy's turn.")
        stand_in = {"role": "assistant", "content": _SENTINEL}
        text = self.tokenizer.apply_chat_template(
            [*history[:-1], stand_in, *observation],
            add_generation_prompt=True,
            enable_thinking=self.enable_thinking,
        )
        after = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        return after[after.index(self.end_of_turn) + len(self.end_of_turn) :]

    def observation_ids(
        self, history: Sequence[Message], observation: Sequence[Message]
    ) -> list[int]:
        return self.tokenizer.encode(self.observation_text(history, observation))


class PlainChat:
    """bos + the user's text as the prompt; tool responses in Qwen3's tags, no chat roles."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Mapping]) -> list[int]:
        del tools  # the task's prompt and demonstrations show the call format
        text = "".join(m["content"] for m in messages if m["role"] in ("system", "user"))
        return self.tokenizer.encode(text, add_bos=True)

    def observation_text(self, history: Sequence[Message], observation: Sequence[Message]) -> str:
        del history
        return "".join(
            f"<tool_response>{m['content']}</tool_response>"
            if m["role"] == "tool"
            else m["content"]
            for m in observation
        )

    def observation_ids(
        self, history: Sequence[Message], observation: Sequence[Message]
    ) -> list[int]:
        return self.tokenizer.encode(self.observation_text(history, observation))
