"""The credit-term registry: ``rl.credit`` names terms from it, `fuse_terms` sums them in its order.

    register_credit_term(MyTerm)          # a CreditTerm subclass (jaxagent.credit.terms)
    parse_credit("infopo+faca")           # ('grpo', 'infopo', 'faca'): the outcome term first
    make_terms(("grpo", "infopo"), {"infopo": InfoPOConfig(beta=1.0)})

Built in, in fusion order: ``grpo`` (the outcome term, always present), ``infopo``, ``faca``.
A registered term joins after them, in registration order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxagent.credit.grpo import GRPOTerm
from jaxagent.credit.infopo import InfoPOTerm
from jaxagent.credit.reaction import FacaTerm
from jaxagent.credit.terms import OUTCOME_TERM, CreditTerm, check_term_class

CREDIT_TERMS: dict[str, type[CreditTerm]] = {cls.name: cls for cls in (GRPOTerm, InfoPOTerm, FacaTerm)}


def register_credit_term(cls: type[CreditTerm], *, replace: bool = False) -> type[CreditTerm]:
    """Adds the term class ``cls`` under ``cls.name`` (usable as a decorator). A name already
    registered is refused unless ``replace``."""
    check_term_class(cls)
    if cls.name in CREDIT_TERMS and not replace and CREDIT_TERMS[cls.name] is not cls:
        raise ValueError(f"credit term {cls.name!r}: already registered ({CREDIT_TERMS[cls.name].__name__}); "
                         "pass replace=True to replace it")
    CREDIT_TERMS[cls.name] = cls
    return cls


def credit_term_names() -> tuple[str, ...]:
    """The registered names, in fusion order."""
    return tuple(CREDIT_TERMS)


def parse_credit(text: str, *, key: str = "credit") -> tuple[str, ...]:
    """``'infopo+faca'`` -> ``('grpo', 'infopo', 'faca')``: the outcome term first, then the named
    terms in registry (fusion) order. ValueError naming ``key`` for an unknown or repeated name."""
    known = credit_term_names()
    expected = (f"is not one of {', '.join(map(repr, known))}, nor a '+'-joined list of them (the registered credit "
                "terms; e.g. 'infopo+faca')")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{key}: {text!r} {expected}")
    names = [n.strip() for n in text.split("+")]
    for n in names:
        if n not in known:
            raise ValueError(f"{key}: {text!r} {expected} ({key}={text!r}: {n!r} is not a registered credit term)")
    if len(set(names)) != len(names):
        raise ValueError(f"{key}: {text!r} names a credit term twice; expected each at most once")
    chosen = {OUTCOME_TERM, *names}
    return tuple(n for n in known if n in chosen)


def make_terms(names: Sequence[str], settings: Mapping[str, Any] | None = None) -> tuple[CreditTerm, ...]:
    """The term objects of ``names`` (`parse_credit`'s output), each with ``settings[name]`` when
    given (and not None), else its settings type's defaults."""
    settings = settings or {}
    out = []
    for name in names:
        cls = CREDIT_TERMS[name]
        s = settings.get(name)
        if cls.settings_type is None:
            out.append(cls())
        else:
            out.append(cls(s if s is not None else cls.settings_type()))
    return tuple(out)


__all__ = ["CREDIT_TERMS", "credit_term_names", "make_terms", "parse_credit", "register_credit_term"]
