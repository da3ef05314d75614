"""A released model's tokenizer and chat template, behind the character tokenizer's interface.

    tok = HFTokenizer("/path/to/Qwen3-0.6B")          # tokenizer.json + tokenizer_config.json
    text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                   enable_thinking=False)
    ids = tok.encode(text)                             # the prompt, special tokens as single ids
    answer = tok.decode(response_ids)                  # what the verifier reads

Why: a pretrained policy only behaves as trained when its prompt is rendered exactly as its chat
template renders it and tokenised by its own tokenizer. The files are the ones a Hugging Face
checkpoint folder ships, read without ``transformers`` (which would pull torch): ``tokenizer.json``
through the ``tokenizers`` library, the special tokens and chat template from
``tokenizer_config.json`` (or ``chat_template.jinja`` beside it, which newer checkpoints use and
which takes precedence), stop ids from ``generation_config.json`` when present. The template is
rendered the way ``transformers``' ``apply_chat_template`` renders it: a sandboxed immutable Jinja
environment with trim_blocks and lstrip_blocks, the ``raise_exception`` and ``strftime_now``
globals, a ``tojson`` filter that keeps non-ASCII text, the loop controls extension and the
``{% generation %}`` tag, with ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
the special token strings (``bos_token``, ``eos_token``, ...) and any extra keyword such as
Qwen3's ``enable_thinking``.

The interface is CharTokenizer's (tasks/tokenizer.py), so tasks, data.py, the sampler and the
trainer use either: ``encode(text, add_bos=, add_eos=)``, ``decode(ids)`` (never raises, drops
pad/bos/eos), ``vocab_size``, ``pad_id``, ``bos_id``, ``eos_id``, ``unk_id``.

Special ids, and why: ``eos_id`` is the config's ``eos_token`` (Qwen3: ``<|im_end|>``, the end of
an assistant turn, where a sampled response must stop); a checkpoint without one takes the first
``eos_token_id`` of its generation config. ``eos_ids`` lists every stop id the generation config
names as well (the sampler stops at ``eos_id`` alone). ``pad_id`` is the config's ``pad_token``,
else the generation config's ``pad_token_id``, else ``eos_id`` (as Qwen does when unset): padding
sits outside every mask, so sharing the eos id is harmless. ``bos_id`` is None when the tokenizer
has no bos token (Qwen); ``encode(add_bos=True)`` then adds nothing. A rendered chat prompt already
holds whatever bos the template writes, so it is encoded without add_bos (``encode_chat``).

``vocab_size`` is the number of ids (largest id + 1) rounded up to a multiple of 8, like
CharTokenizer's, so that the vocabulary axis divides a tensor-parallel mesh; ids past the
tokenizer's own decode to "?".

Dimension legend: L = number of tokens in one sequence.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

UNKNOWN_ID_TEXT = "?"  # what an id outside the tokenizer decodes to (as CharTokenizer's spare ids)


def _token_content(entry: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string, an AddedToken dict with
    "content", or null."""
    if entry is None:
        return None
    if isinstance(entry, Mapping):
        entry = entry.get("content")
    if not isinstance(entry, str) or not entry:
        return None
    return entry


def _first_id(value: Any) -> int | None:
    """An id field of generation_config.json: an int, a list of ints (first), or null."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _all_ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        out = json.load(f)
    if not isinstance(out, dict):
        raise ValueError(f"{path} holds {type(out).__name__}, not a JSON object.")
    return out


def _select_template(value: Any, path: str) -> str | None:
    """tokenizer_config.json's "chat_template": a string, or a list of named templates (some
    checkpoints ship "default" beside "tool_use"), of which the default one is used."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(
        f"chat_template in {path} is neither a string nor a list holding a 'default' template."
    )


@functools.cache
def _jinja_environment():
    """The environment transformers renders chat templates in (built once: creating it is slow).

    Sandboxed and immutable because a template comes with downloaded files: it may not reach
    Python internals nor mutate the messages it is given.
    """
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}``: marks the assistant's part in templates
        that support assistant masks; rendered as its body, as transformers does."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    return _jinja_environment().from_string(template)


class HFTokenizer:
    """A Hugging Face tokenizer folder (see the module docstring) with CharTokenizer's interface.

    ``path`` is the folder holding tokenizer.json and tokenizer_config.json (or the path of
    tokenizer.json itself). ``multiple_of`` rounds ``vocab_size`` up.
    """

    def __init__(self, path: str | os.PathLike, *, multiple_of: int = 8):
        from tokenizers import Tokenizer

        path = os.fspath(path)
        folder = os.path.dirname(path) if os.path.isfile(path) else path
        tokenizer_file = path if os.path.isfile(path) else os.path.join(folder, "tokenizer.json")
        config_file = os.path.join(folder, "tokenizer_config.json")
        for f in (tokenizer_file, config_file):
            if not os.path.isfile(f):
                raise FileNotFoundError(
                    f"{f} not found: HFTokenizer needs a checkpoint folder with tokenizer.json "
                    "and tokenizer_config.json (as a Hugging Face model repository ships them)."
                )
        if multiple_of < 1:
            raise ValueError(f"multiple_of must be >= 1, got {multiple_of}.")
        self.path = folder
        self._tok = Tokenizer.from_file(tokenizer_file)
        config = _read_json(config_file)
        gen_file = os.path.join(folder, "generation_config.json")
        gen = _read_json(gen_file) if os.path.isfile(gen_file) else {}

        template_file = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(template_file):
            with open(template_file, encoding="utf-8") as f:
                self.chat_template: str | None = f.read()
        else:
            self.chat_template = _select_template(config.get("chat_template"), config_file)

        # Special token strings, as templates see them (bos_token, eos_token, ...).
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            content = _token_content(config.get(key))
            if content is not None:
                self.special_tokens[key] = content

        self.num_ids = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1
        self.vocab_size = -(-self.num_ids // multiple_of) * multiple_of

        eos = self._id_of("eos_token") if "eos_token" in self.special_tokens else None
        gen_eos = [i for i in _all_ids(gen.get("eos_token_id")) if 0 <= i < self.num_ids]
        if eos is None:
            if not gen_eos:
                raise ValueError(
                    f"{self.path} names no eos token (tokenizer_config.json eos_token or "
                    "generation_config.json eos_token_id): a sampled response could never stop."
                )
            eos = gen_eos[0]
        self.eos_id: int = eos
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys([eos, *gen_eos]))
        if "pad_token" in self.special_tokens:
            self.pad_id: int = self._id_of("pad_token")
        else:
            gen_pad = _first_id(gen.get("pad_token_id"))
            self.pad_id = gen_pad if gen_pad is not None and 0 <= gen_pad < self.num_ids else eos
        self.bos_id: int | None = (
            self._id_of("bos_token") if "bos_token" in self.special_tokens else None
        )
        self.unk_id: int | None = (
            self._id_of("unk_token") if "unk_token" in self.special_tokens else None
        )
        self._dropped = frozenset(
            i for i in (self.pad_id, self.bos_id, *self.eos_ids) if i is not None
        )

    def _id_of(self, key: str) -> int:
        token = self.special_tokens[key]
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(
                f"{key} {token!r} of {self.path}/tokenizer_config.json is not in tokenizer.json's "
                "vocabulary; the two files come from different tokenizers."
            )
        return i

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    # ---- CharTokenizer's interface ----------------------------------------------------------
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text`` [L]; special tokens written in the text (``<|im_start|>``) become their
        single ids. Nothing else is added: no post-processor template, bos only when asked and
        the tokenizer has one."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        if add_eos:
            ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, never raising whatever ids it gets (model output can be anything):
        pad, bos and stop ids are dropped, other special tokens kept (the verifier sees what the
        model wrote), ids outside the tokenizer read as "?" (runs between them decode apart)."""
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            if i in self._dropped:
                continue
            if 0 <= i < self.num_ids:
                run.append(i)
                continue
            if run:
                pieces.append(self._tok.decode(run, skip_special_tokens=False))
                run = []
            pieces.append(UNKNOWN_ID_TEXT)
        if run:
            pieces.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(pieces)

    # ---- chat template ----------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        enable_thinking: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The conversation rendered by the checkpoint's chat template (a string, not ids).

        ``enable_thinking`` is passed only when not None: Qwen3's template tests ``enable_thinking
        is defined and enable_thinking is false`` and then writes an empty thinking block after
        the generation prompt; templates without the switch ignore it. A template's
        ``raise_exception`` surfaces as jinja2.TemplateError.
        """
        if self.chat_template is None:
            raise ValueError(
                f"{self.path} has no chat template (tokenizer_config.json chat_template or "
                "chat_template.jinja); use encode() on plain text instead."
            )
        kwargs = {**self.special_tokens, **template_kwargs}
        if enable_thinking is not None:
            kwargs["enable_thinking"] = enable_thinking
        return _compile(self.chat_template).render(
            messages=[dict(m) for m in messages],
            tools=None if tools is None else list(tools),
            documents=None if documents is None else list(documents),
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], **kwargs: Any) -> list[int]:
        """``encode(apply_chat_template(messages, **kwargs))``: no bos added, since the template
        writes the bos its model expects (as transformers tokenises a rendered chat)."""
        return self.encode(self.apply_chat_template(messages, **kwargs))

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(path={self.path!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id}, "
            f"pad_id={self.pad_id}, bos_id={self.bos_id})"
        )
