"""The products task (tasks/products.py) as an environment with the sandboxed Python tool.

    env = ProductsEnvironment(digits=8)                     # the difficulty knob
    records = env.problems("train", 1000)                   # {"prompt", "a", "b", "target"}
    row = run_episode(env, records[0], scripted_policy(env.demonstration(records[0]),
                                                       env.chat.tokenizer))

The problems, the prompt and the verdict are the task's (tasks.ProductsTask); this module adds
the worked example: demonstration() gives the policy's turns (the tool call and, after the tool's
response, the answer; or the answer alone). Played through run_episode they are the warm start's
rows (rl/warmstart_tools.py), the call format shown with a real tool response:
``<tool_call>{"name": "python", "arguments": {"code": "print(a * b)"}}</tool_call>``.

Default rendering: PlainChat with the task's character tokenizer (the project's small models);
pass ``chat=TemplateChat(HFTokenizer(...))`` for a released checkpoint's template.

Dimension legend: none (records are scalars).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gspo_jax.envs.chat import ChatFormat
from gspo_jax.envs.environment import EpisodeLimits
from gspo_jax.envs.tool_calls import Tool
from gspo_jax.envs.tool_env import TaskToolEnvironment, python_tool
from gspo_jax.tasks import products

ALPHABET = products.ALPHABET
DEFAULT_LIMITS = EpisodeLimits(max_turns=3)


class ProductsEnvironment(TaskToolEnvironment):
    """a * b with operands of ``digits`` digits (or ``min_digits``..``digits``; a share
    ``easy_fraction`` of them a * 10^(digits-1)), the Python tool available."""

    def __init__(
        self,
        *,
        digits: int = 6,
        min_digits: int | None = None,
        easy_fraction: float = 0.0,
        seed: int = 0,
        format_weight: float = 0.1,
        chat: ChatFormat | None = None,
        limits: EpisodeLimits = DEFAULT_LIMITS,
        tool: Tool | None = None,
    ):
        task = products.ProductsTask(
            digits=digits,
            min_digits=min_digits,
            easy_fraction=easy_fraction,
            seed=seed,
            format_weight=format_weight,
            num_train=1,
            num_test=1,
        )
        super().__init__(
            task, tools=[tool if tool is not None else python_tool()], chat=chat, limits=limits
        )
        self.digits, self.min_digits, self.easy_fraction = digits, min_digits, easy_fraction
        self.seed, self.format_weight = seed, format_weight
        self.config = dict(
            digits=digits,
            min_digits=min_digits,
            easy_fraction=easy_fraction,
            seed=seed,
            format_weight=format_weight,
        )

    def problems(self, split: str, n: int) -> list[dict[str, Any]]:
        """``n`` distinct problems of ``split``, deterministic by seed; the train split avoids
        the first ``n`` test problems (held-out ones are never trained on)."""
        task = products.ProductsTask(
            digits=self.digits,
            min_digits=self.min_digits,
            easy_fraction=self.easy_fraction,
            seed=self.seed,
            format_weight=self.format_weight,
            num_train=n,
            num_test=n,
        )
        return task.generate_split(split)

    @staticmethod
    def question(a: int, b: int) -> str:
        return products.question(a, b)

    def demonstration(self, record: Mapping[str, Any], *, with_tool: bool = True) -> list[str]:
        """The policy's turns of a worked example: the call, then the answer (the tool's
        response comes between them when played); or the answer alone."""
        if with_tool:
            return self.task.tool_demonstration(record)
        return [products.answer_text(int(record["a"]), int(record["b"]))]
