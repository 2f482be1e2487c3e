"""The LLM user simulator's settings (`LLMUserConfig`): endpoint, sampling, prompt, retries and
time budget, checked at construction (errors name the field, the value and what was expected)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from jaxagent.envs.user_prompt import DEFAULT_SYSTEM_PROMPT, template_fields

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_number(name: str, value: Any, *, lo: float, lo_open: bool = False, hi: float = math.inf) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi != math.inf else "")
        raise ValueError(f"LLMUserConfig.{name}={value!r}: expected a finite number {bound}")
    return float(value)


def _check_int(name: str, value: Any, *, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"LLMUserConfig.{name}={value!r}: expected an int >= {lo}")
    return value


@dataclasses.dataclass(frozen=True)
class LLMUserConfig:
    """Settings of the HTTP user simulator; validated on construction (errors name the field, the
    value and what was expected). ``api_key_env`` is the NAME of an environment variable (None:
    no Authorization header, as for a local vLLM/SGLang server)."""

    base_url: str
    model: str
    temperature: float = 0.7
    api_key_env: str | None = None
    max_concurrency: int = 16
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    retry_after_max_s: float = 120.0
    stop_markers: tuple[str, ...] = ("###STOP###",)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    opening_message: str = "Hi! How can I help you today?"
    max_tokens: int | None = 512
    json_mode: bool = False  # also send response_format={"type": "json_object"} (not every server has it)
    trust_env: bool = True  # honour HTTP(S)_PROXY / NO_PROXY from the environment
    seed: int | None = None  # the backoff jitter's RNG

    def __post_init__(self):
        url = self.base_url
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ValueError(f"LLMUserConfig.base_url={url!r}: expected an http:// or https:// URL "
                             "such as 'http://127.0.0.1:8000/v1'")
        object.__setattr__(self, "base_url", url.rstrip("/"))
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"LLMUserConfig.model={self.model!r}: expected a non-empty model name")
        _check_number("temperature", self.temperature, lo=0.0, hi=2.0)
        env = self.api_key_env
        if env is not None and (not isinstance(env, str) or not _ENV_NAME.match(env)):
            # Never echo the value: a key pasted here by mistake must not reach logs or tracebacks.
            raise ValueError("LLMUserConfig.api_key_env=<not shown>: expected None or the NAME of an environment "
                             "variable holding the key ([A-Za-z_][A-Za-z0-9_]*), not the key itself")
        _check_int("max_concurrency", self.max_concurrency, lo=1)
        _check_number("connect_timeout_s", self.connect_timeout_s, lo=0.0, lo_open=True)
        _check_number("read_timeout_s", self.read_timeout_s, lo=0.0, lo_open=True)
        _check_int("max_retries", self.max_retries, lo=0)
        _check_number("backoff_base_s", self.backoff_base_s, lo=0.0)
        _check_number("backoff_max_s", self.backoff_max_s, lo=self.backoff_base_s)
        _check_number("retry_after_max_s", self.retry_after_max_s, lo=0.0)
        markers = self.stop_markers
        if isinstance(markers, str) or not isinstance(markers, Sequence) or not all(
                isinstance(m, str) and m.strip() for m in markers):
            raise ValueError(f"LLMUserConfig.stop_markers={markers!r}: expected a sequence of non-empty strings")
        object.__setattr__(self, "stop_markers", tuple(markers))
        if not isinstance(self.system_prompt, str) or not self.system_prompt.strip():
            raise ValueError(f"LLMUserConfig.system_prompt={self.system_prompt!r}: expected a non-empty template")
        if "stop_marker" in template_fields(self.system_prompt) and not self.stop_markers:
            raise ValueError("LLMUserConfig.system_prompt uses {stop_marker} but stop_markers=(); "
                             "expected at least one stop marker")
        if not isinstance(self.opening_message, str) or not self.opening_message.strip():
            raise ValueError(f"LLMUserConfig.opening_message={self.opening_message!r}: expected a non-empty string")
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, lo=1)
        for name in ("json_mode", "trust_env"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LLMUserConfig.{name}={getattr(self, name)!r}: expected a bool")
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def call_budget_s(self) -> float:
        """The most seconds one call (every attempt and backoff sleep) takes, about (module
        docstring, "Time budget"): ``(max_retries + 1) * (connect_timeout_s + read_timeout_s)``
        plus, for each retry k, ``max(min(backoff_max_s, backoff_base_s * 2**k), retry_after_max_s)``."""
        sleeps = sum(max(min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(k, 60)), self.retry_after_max_s)
                     for k in range(self.max_retries))
        return (self.max_retries + 1) * (self.connect_timeout_s + self.read_timeout_s) + sleeps


__all__ = ["LLMUserConfig"]
