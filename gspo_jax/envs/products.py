"""A laptop-sized problem where the tool matters: the product of two large numbers.

    env = ProductsEnvironment(digits=8)                     # the difficulty knob
    records = env.problems("train", 1000)                   # {"prompt", "a", "b", "target"}
    row = run_episode(env, records[0], scripted_policy(env.demonstration(records[0]),
                                                       env.chat.tokenizer))

A small model cannot multiply two 8-digit numbers in its head reliably (every digit of the
product depends on many digit products and carries), but it can write
``<tool_call>{"name": "python", "arguments": {"code": "print(a * b)"}}</tool_call>``, read the
tool response and copy the number. With ``digits`` 1-2 the answer is easy without the tool, so the
tool-call rate by difficulty shows whether a policy learned where the tool helps.

The final turn answers ``Answer: <number>``. Reward: correct (1/0: the last "Answer:" holds the
product and the turn ended with eos) + format_weight * format (1/0: it ended with eos and holds an
"Answer:" with digits). demonstration() gives the turns of a worked example (with the tool call
and, after the tool's response, the answer; or the answer alone): played through run_episode they
are the warm start's rows, the call format shown with a real tool response.

Default rendering: PlainChat with a character tokenizer over printable ASCII (the project's
small models); pass ``chat=TemplateChat(HFTokenizer(...))`` for a released checkpoint's template.

Dimension legend: none (records are scalars).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from typing import Any

from gspo_jax.envs.chat import ChatFormat, Message, PlainChat
from gspo_jax.envs.environment import EpisodeLimits
from gspo_jax.envs.tool_calls import CLOSE, OPEN, Tool
from gspo_jax.envs.tool_env import ToolEnvironment, python_tool
from gspo_jax.tasks.task import Verdict, check_split, split_seed
from gspo_jax.tasks.tokenizer import CharTokenizer

ALPHABET = "\n" + "".join(c for c in string.printable if c.isprintable())  # ASCII 32-126
DEFAULT_LIMITS = EpisodeLimits(max_turns=3)
_ANSWER = re.compile(r"Answer:\s*(\d{1,40})")


class ProductsEnvironment(ToolEnvironment):
    """a * b with operands of exactly ``digits`` digits, the Python tool available."""

    def __init__(
        self,
        *,
        digits: int = 6,
        seed: int = 0,
        format_weight: float = 0.1,
        chat: ChatFormat | None = None,
        limits: EpisodeLimits = DEFAULT_LIMITS,
        tool: Tool | None = None,
    ):
        if not 1 <= digits <= 18:
            raise ValueError(f"digits must lie in [1, 18], got {digits}.")
        self.digits, self.seed, self.format_weight = digits, seed, format_weight
        self.config = dict(digits=digits, seed=seed, format_weight=format_weight)
        self.chat = chat if chat is not None else PlainChat(CharTokenizer(ALPHABET))
        self.limits = limits
        tool = tool if tool is not None else python_tool()
        self.tools = {tool.name: tool}

    # ---- problems -------------------------------------------------------------------------
    def problems(self, split: str, n: int) -> list[dict[str, Any]]:
        """``n`` distinct problems of ``split``, deterministic by seed; the train split avoids
        the first ``n`` test problems (held-out ones are never trained on)."""
        check_split(split)
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits
        space = (hi - lo) ** 2
        if n > space // 4:
            raise ValueError(
                f"{n} problems asked of {self.digits}-digit operands: at most {space // 4}."
            )
        held_out = (
            set() if split == "test" else {(r["a"], r["b"]) for r in self.problems("test", n)}
        )
        rng, seen, out = split_seed(self.seed, split), set(held_out), []
        while len(out) < n:
            a, b = int(rng.integers(lo, hi)), int(rng.integers(lo, hi))
            if (a, b) not in seen:
                seen.add((a, b))
                out.append(dict(prompt=self.question(a, b), a=a, b=b, target=a * b))
        return out

    @staticmethod
    def question(a: int, b: int) -> str:
        return f"What is {a} * {b}? End with: Answer: <the product>\n"

    def first_messages(self, record: Mapping[str, Any]) -> list[Message]:
        return [{"role": "user", "content": self.question(int(record["a"]), int(record["b"]))}]

    # ---- warm start -----------------------------------------------------------------------
    def demonstration(self, record: Mapping[str, Any], *, with_tool: bool = True) -> list[str]:
        """The policy's turns of a worked example: the call, then the answer (the tool's
        response comes between them when played); or the answer alone."""
        a, b = int(record["a"]), int(record["b"])
        answer = f"Answer: {a * b}"
        if not with_tool:
            return [answer]
        call = {"name": "python", "arguments": {"code": f"print({a} * {b})"}}
        return [f"{OPEN}{json.dumps(call)}{CLOSE}", answer]

    # ---- verifier -------------------------------------------------------------------------
    def verdict(self, record: Mapping[str, Any], text: str, terminated: bool) -> Verdict:
        answers = _ANSWER.findall(text)
        well_formed = float(terminated and bool(answers))
        correct = float(well_formed > 0 and int(answers[-1]) == int(record["target"]))
        return Verdict(correct + self.format_weight * well_formed, correct, well_formed)
