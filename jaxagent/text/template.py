"""Chat templates: compile and render Hugging Face Jinja chat templates (host code).

The environment matches the one ``transformers.apply_chat_template`` uses (sandboxed, immutable,
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` filter that does not escape
HTML and keeps non-ASCII text, ``raise_exception``, ``strftime_now``, and ``{% generation %}``
blocks rendered as plain text), so ``render_template`` gives the same string as
``tokenizer.apply_chat_template(..., tokenize=False)``; the tests check this on the fixtures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = ["ChatTemplateError", "compile_template", "render_template", "template_variables"]


class ChatTemplateError(ValueError):
    """A chat template is missing, cannot be compiled, cannot render the input, or cannot be
    rendered incrementally; the message names the field or message and what was expected."""


def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker): the body
        is rendered unchanged."""

        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


@lru_cache(maxsize=1)
def _env():
    return _environment()


@lru_cache(maxsize=32)
def compile_template(source: str):
    """Compile a chat template source string (cached). Raises ChatTemplateError on syntax errors."""
    import jinja2

    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError(f"chat_template: expected a non-empty Jinja source string, got {source!r:.80}")
    try:
        return _env().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat_template: Jinja syntax error at line {e.lineno}: {e.message}") from e


@lru_cache(maxsize=32)
def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads from its context (``messages``, ``tools``,
    ``add_generation_prompt``, ``enable_thinking``, ...)."""
    import jinja2.meta

    compile_template(source)
    return frozenset(jinja2.meta.find_undeclared_variables(_env().parse(source)))


def _plain(value: Any) -> Any:
    """A copy made of plain JSON types (dict/list/str/int/float/bool/None); tuples become lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _plain(to_dict())
    raise ChatTemplateError(f"template input: {type(value).__name__} value {value!r:.60} is not JSON-like; "
                            f"expected dict, list, str, number, bool or None")


def render_template(source: str, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping] | None = None,
                    add_generation_prompt: bool = False, special_tokens: Mapping[str, str] | None = None,
                    ignore_raise_exception: bool = False, **kwargs: Any) -> str:
    """Render ``messages`` (and ``tools``, OpenAI function schemas) with a chat template to text.

    ``special_tokens`` are the tokenizer's named special tokens (``{"eos_token": "<|im_end|>",
    "pad_token": ...}``, :attr:`Tokenizer.special_tokens`), template variables as in
    ``apply_chat_template`` (which passes ``{**tokenizer.special_tokens_map, **kwargs}``). Extra
    keyword arguments are template variables (e.g. ``enable_thinking=False``) and override a special
    token of the same name.

    ``ignore_raise_exception=True`` makes the template's ``raise_exception(...)`` render as empty
    text instead of aborting. It is for auxiliary renders of a *partial* conversation whose only use
    is to locate text (the renderer's closing boundaries): a validation that the whole conversation
    passes (Qwen3's "No user query found in messages.") must not reject one of its prefixes.

    Errors the template raises (``raise_exception``, undefined values) become ChatTemplateError.
    """
    import jinja2

    template = compile_template(source)
    variables = {str(k): str(v) for k, v in (special_tokens or {}).items()}
    variables.update((k, _plain(v)) for k, v in kwargs.items())
    if ignore_raise_exception:
        variables["raise_exception"] = _ignore_exception
    try:
        return template.render(messages=_plain(list(messages)), tools=_plain(list(tools)) if tools else None,
                               documents=None, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template failed to render {len(messages)} message(s): "
                                f"{type(e).__name__}: {e}") from e


def _ignore_exception(message: Any = None) -> str:
    return ""
