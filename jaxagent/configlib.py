"""Typed configuration from frozen dataclasses, YAML files and dotted command-line overrides.

A schema is a tree of ``@dataclasses.dataclass(frozen=True)`` classes whose fields all have
defaults. Supported field types: ``int``, ``float`` (ints are accepted and converted), ``str``,
``bool`` (real bools only), ``Literal[...]`` of strings/ints, ``X | None``, ``tuple[T, ...]``
(lists are accepted), ``dict[str, T]``, ``Any`` (any YAML value, kept as parsed: a plug-in's own
settings, checked by the plug-in) and nested dataclasses (given as mappings). A section checks
itself at construction (``__post_init__``); a ``ValueError`` raised there is reported as a
:class:`ConfigError` under the section's dotted path. ``field(metadata={"help": "..."})`` adds a
line to :func:`describe`.

Example::

    from __future__ import annotations
    import dataclasses
    from typing import Literal
    from jaxagent import configlib

    @dataclasses.dataclass(frozen=True)
    class Optim:
        lr: float = 3e-4
        betas: tuple[float, ...] = (0.9, 0.95)

    @dataclasses.dataclass(frozen=True)
    class Config:
        method: Literal["grpo", "infopo"] = "grpo"
        optim: Optim = dataclasses.field(default_factory=Optim)

    cfg = configlib.load(Config, "run.yaml", ["optim.lr=3e-7", "method=infopo"])
    print(configlib.dump_yaml(cfg))            # the resolved config, for the run directory
    print(configlib.describe(Config))          # every dotted key, its type and default

Errors name the full dotted key, the value given and what was expected, e.g.
``optim.lr: expected float, got 'fast' (str)``. A YAML file may start from another with a
top-level ``include: base.yaml`` (relative to the file); the key ``include`` is reserved there.
Merging is deep: mappings merge key by key, every other value replaces.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import yaml

__all__ = [
    "ConfigError",
    "apply_overrides",
    "deep_merge",
    "describe",
    "dump_yaml",
    "from_dict",
    "load",
    "parse_section",
    "read_yaml",
    "to_dict",
]

_NoneType = type(None)
_SCALARS = (int, float, str, bool)


class ConfigError(ValueError):
    """A configuration value, key, file or override is invalid; the message says where and why."""


# ----------------------------------------------------------------------------- type helpers


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _members(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union (without None), or ``(tp,)``."""
    return tuple(a for a in typing.get_args(tp) if a is not _NoneType) if _is_union(tp) else (tp,)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _section(tp: Any) -> type | None:
    """The dataclass behind ``tp`` or ``tp | None``, else None."""
    members = _members(tp)
    return members[0] if len(members) == 1 and _is_dataclass_type(members[0]) else None


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is _NoneType:
        return "None"
    if tp is Any:
        return "Any"
    if origin is Literal:
        return " | ".join(map(repr, args))
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in args)
    if origin is tuple:
        return "tuple[" + ", ".join("..." if a is Ellipsis else _type_name(a) for a in args) + "]"
    if origin is dict:
        return f"dict[{_type_name(args[0])}, {_type_name(args[1])}]"
    return getattr(tp, "__name__", repr(tp))


def _show(value: Any) -> str:
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:77] + '...'} ({type(value).__name__})"


def _at(path: str) -> str:
    return f"{path}: " if path else ""


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _unknown_key(path: str, key: Any, allowed: Sequence[str]) -> ConfigError:
    msg = f"{_join(path, key)}: unknown key; allowed keys: {', '.join(sorted(allowed))}"
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    return ConfigError(msg + (f"; did you mean {close[0]!r}?" if close else ""))


# ----------------------------------------------------------------------------- building


def _convert(tp: Any, value: Any, path: str) -> Any:
    """Check ``value`` against ``tp`` and return it in canonical form (floats, tuples, dataclasses)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:  # a YAML value as parsed (scalars, lists, string-keyed mappings)
        _check_plain(value, path)
        return copy.deepcopy(_plain(value))
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is Literal or (_is_union(tp) and all(typing.get_origin(m) is Literal for m in _members(tp))):
        choices = [c for m in _members(tp) for c in typing.get_args(m)]
        choices += [None] * (_is_union(tp) and _NoneType in args)
        for c in choices:
            if value == c and type(value) is type(c):
                return c
        raise ConfigError(f"{_at(path)}{value!r} is not one of {', '.join(map(repr, choices))}")
    elif _is_union(tp):
        if value is None and _NoneType in args:
            return None
        members = _members(tp)
        if len(members) == 1 and members[0] not in _SCALARS:
            return _convert(members[0], value, path)  # e.g. a section or tuple: report the inner error
        for member in members:
            try:
                return _convert(member, value, path)
            except ConfigError:
                pass
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(_convert(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
            if len(value) == len(args):
                return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    elif origin is dict:
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str):
                    raise ConfigError(f"{_at(path)}keys must be str, got {_show(k)}")
                out[k] = _convert(args[1], v, _join(path, k))
            return out
    elif _is_dataclass_type(tp):
        if isinstance(value, tp):
            value = to_dict(value)
        return from_dict(tp, value, path=path)
    else:
        raise TypeError(f"{_at(path)}unsupported field type {_type_name(tp)}")
    raise ConfigError(f"{_at(path)}expected {_type_name(tp)}, got {_show(value)}")


def _check_plain(value: Any, path: str) -> None:
    """``value`` is made of what YAML gives (None, bool, int, float, str, lists, str-keyed mappings)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{_at(path)}keys must be str, got {_show(k)}")
            _check_plain(v, _join(path, k))
        return
    raise ConfigError(f"{_at(path)}expected a YAML value (null, bool, number, str, list or mapping), got {_show(value)}")


def from_dict(cls: type, data: Mapping[str, Any], *, path: str = "") -> Any:
    """Build the dataclass ``cls`` (and its nested sections) from ``data``, checking every value.

    Missing keys take the field defaults; unknown keys, wrongly typed values and failed
    construction checks (``__post_init__``) raise :class:`ConfigError` naming the full dotted key (under ``path``).
    """
    if not _is_dataclass_type(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_at(path)}expected a mapping for {cls.__name__}, got {_show(data)}")
    hints, fields = _hints(cls), _fields(cls)
    names = [f.name for f in fields]
    for key in data:
        if key not in names:
            raise _unknown_key(path, key, names)
    kwargs = {}
    for f in fields:
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], _join(path, f.name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(path, f.name)}: missing required key ({_type_name(hints[f.name])})")
    try:
        obj = cls(**kwargs)  # sections check themselves at construction (__post_init__)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(_dotted(cls, names, path, str(e))) from e
    return obj


def parse_section(cls: type, data: Mapping[str, Any], *, path: str = "") -> Any:
    """`from_dict` after the coercions an override gets (``3e-7`` read as a str by YAML 1.1 becomes a
    float where ``cls`` wants one): a section given as a free-form mapping (a plug-in's options)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_at(path)}expected a mapping for {cls.__name__}, got {_show(data)}")
    return from_dict(cls, _coerce(cls, data), path=path)


def _dotted(cls: type, names: Sequence[str], path: str, message: str) -> str:
    """A section's check message under its dotted path: ``'top_p=0.0: ...'`` (or the class-named
    ``'GRPOConfig.eps=0: ...'``) raised in section ``rollout`` reads ``'rollout.top_p=0.0: ...'``;
    any other message is prefixed with ``'rollout: '``."""
    if path:
        if message.startswith((f"{path}.", f"{path}=")):  # already dotted
            return message
        for prefix in (f"{cls.__name__}.", ""):
            if message.startswith(prefix):
                rest = message[len(prefix):]
                head = rest.split("=", 1)[0].split(":", 1)[0]
                if head in names and len(head) < len(rest):
                    return f"{path}.{rest}"
    return f"{_at(path)}{message}"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in _fields(type(value))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_dict(obj: Any) -> dict[str, Any]:
    """The dataclass ``obj`` as plain dicts/lists/scalars; ``from_dict(type(obj), to_dict(obj)) == obj``."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(obj).__name__}")
    return _plain(obj)


def dump_yaml(obj: Any) -> str:
    """The dataclass ``obj`` (or a plain mapping) as YAML, in field order; loads back with :func:`load`."""
    data = to_dict(obj) if dataclasses.is_dataclass(obj) else _plain(obj)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    if yaml.safe_load(text) != data:  # PyYAML emits some characters (U+0085) raw that it reads back differently
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=False, default_flow_style=False)
    return text


# ----------------------------------------------------------------------------- merging and overrides


def _merge_into(dst: dict, src: Mapping) -> dict:
    for key, value in src.items():
        if isinstance(value, Mapping) and isinstance(dst.get(key), Mapping):
            dst[key] = _merge_into(dict(dst[key]), value)
        else:
            dst[key] = copy.deepcopy(_plain(value))
    return dst


def deep_merge(base: Mapping, override: Mapping) -> dict:
    """A new dict: ``override`` over ``base``; mappings merge recursively, everything else replaces."""
    return _merge_into(copy.deepcopy(_plain(base)), override)


def _coerce(tp: Any, value: Any, raw: str | None = None) -> Any:
    """Fix what YAML 1.1 parsed differently from what the schema wants: ``3e-7`` (a str in YAML 1.1)
    for a float, and for a str field a bare ``2024`` or ``yes`` (``raw`` is the override's text)."""
    members = _members(tp)
    if isinstance(value, str) and str not in members:
        for t in (int, float):
            if t in members:
                try:
                    return t(value)
                except ValueError:
                    pass
    elif raw is not None and str in members and isinstance(value, (bool, int, float)):
        accepted = {bool: (bool,), int: (int, float), float: (float,)}[type(value)]
        if not any(m in members for m in accepted):
            return raw.strip()
    elif isinstance(value, (list, tuple)):
        for m in members:
            args = typing.get_args(m)
            if typing.get_origin(m) is tuple and args:
                elems = [args[0]] * len(value) if args[-1] is Ellipsis else args
                return [_coerce(t, v) for t, v in zip(elems, value)] + list(value[len(elems) :])
    elif isinstance(value, Mapping):
        section = _section(tp)
        if section is not None:
            hints = _hints(section)
            return {k: _coerce(hints[k], v) if k in hints else v for k, v in value.items()}
        for m in members:
            if typing.get_origin(m) is dict:
                return {k: _coerce(typing.get_args(m)[1], v) for k, v in value.items()}
    return value


def _target_type(schema: type, keys: list[str], override: str) -> Any:
    """The schema type at dotted ``keys``; unknown keys and paths through non-sections are errors."""
    tp: Any = schema
    for i, key in enumerate(keys):
        path = ".".join(keys[:i])
        if tp is Any:  # inside a free-form value: any key
            return Any
        section, members = _section(tp), _members(tp)
        if section is not None:
            names = [f.name for f in _fields(section)]
            if key not in names:
                raise ConfigError(f"override {override!r}: {_unknown_key(path, key, names)}")
            tp = _hints(section)[key]
        elif len(members) == 1 and typing.get_origin(members[0]) is dict:
            tp = typing.get_args(members[0])[1]
        else:
            raise ConfigError(f"override {override!r}: {path} is a {_type_name(tp)}, not a section")
    return tp


def apply_overrides(data: Mapping, overrides: Sequence[str], *, schema: type | None = None) -> dict:
    """A copy of ``data`` with each ``a.b.c=value`` override applied (the value parsed as YAML).

    With ``schema`` (the root dataclass), keys are checked against it and values coerced to it
    (``lr=3e-7`` becomes a float); without it any key is accepted as is. A mapping value merges
    into the existing section (``optim={lr: 0.1}``).
    """
    out = copy.deepcopy(_plain(data))
    for override in overrides:
        if not isinstance(override, str) or "=" not in override:
            raise ConfigError(f"override {override!r}: expected key=value, e.g. optim.lr=3e-4")
        key, raw = override.split("=", 1)
        keys = key.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {override!r}: empty key in {key.strip()!r}")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"override {override!r}: value is not valid YAML: {e}") from e
        if schema is not None:
            value = _coerce(_target_type(schema, keys, override), value, raw)
        node = out
        for k in keys[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        if isinstance(value, Mapping) and isinstance(node.get(keys[-1]), dict):
            _merge_into(node[keys[-1]], value)
        else:
            node[keys[-1]] = value
    return out


# ----------------------------------------------------------------------------- files


def _check_duplicate_keys(node: yaml.Node | None, path: Path, at: str = "") -> None:
    """A key given twice in one mapping of a YAML file is an error (PyYAML keeps the last one
    silently), named by its dotted path and both lines."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"{path}: line {line}: duplicate key {_join(at, key)} (first given on line "
                                      f"{seen[key]}); expected each key once per mapping")
                seen[key] = line
            _check_duplicate_keys(value_node, path, _join(at, key) if key is not None else at)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, path, f"{at}[{i}]")


def read_yaml(path: str | Path, chain: tuple[Path, ...] = ()) -> dict:
    """A config file as a mapping (after the file it includes, if any); ConfigError naming the file
    for unreadable or invalid YAML, duplicate keys and include cycles."""
    path = Path(path)
    resolved = path.resolve()
    if resolved in chain:
        raise ConfigError("include cycle: " + " -> ".join(str(p) for p in (*chain, resolved)))
    try:
        text = path.read_text()
        _check_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        data = yaml.safe_load(text)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping, got {type(data).__name__}")
    include = data.pop("include", None)
    if include is None:
        return data
    if not isinstance(include, str):
        raise ConfigError(f"{path}: include: expected a file name (str), got {_show(include)}")
    return deep_merge(read_yaml(path.parent / include, (*chain, resolved)), data)


def load(
    cls: type,
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    base: Mapping | None = None,
) -> Any:
    """Resolve a config: ``base`` (a mapping or a ``cls`` instance), then the YAML file at ``path``
    (after the file it includes, if any), then ``overrides``; then build and check it as ``cls``."""
    data = _plain(base) if base is not None else {}
    if path is not None:
        data = deep_merge(data, read_yaml(path))
    return from_dict(cls, apply_overrides(data, overrides, schema=cls))


# ----------------------------------------------------------------------------- help


DEFAULT_SHOWN_MAX = 40
"""A default whose repr is longer than this is elided in `describe` (its length and first characters)."""


def _default_text(value: Any, owner: type) -> str:
    """``= repr`` of a default, elided past `DEFAULT_SHOWN_MAX` characters: a string as
    ``= <N chars: 'first ch...'>``, anything else as a pointer to the class that defines it."""
    if value is dataclasses.MISSING:
        return "(required)"
    text = repr(value)
    if len(text) <= DEFAULT_SHOWN_MAX:
        return "= " + text
    if isinstance(value, str):
        return f"= <{len(value)} chars: {text[:13]}...{text[0]}>"
    return f"= (long; see {owner.__name__} in {owner.__module__.replace('.', '/')}.py)"


def _rows(cls: type, prefix: str, instance: Any,
          seen: dict[tuple, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) of every key under ``cls``. A section whose class and
    defaults equal those of one listed before (``seen``: signature -> its key) is not expanded
    again: its row points at the first one's keys."""
    seen = {} if seen is None else seen
    rows = []
    hints = _hints(cls)
    for f in _fields(cls):
        tp, key = hints[f.name], _join(prefix, f.name)
        if instance is not None:
            default = getattr(instance, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        section = _section(tp)
        help_text = f.metadata.get("help", "")
        if section is None:
            rows.append((key, _type_name(tp), _default_text(default, cls), help_text))
            continue
        inner = default if isinstance(default, section) else None
        signature = (section, tuple(_rows(section, "", inner, {})))
        first = seen.get(signature)
        if first is not None:
            note = f"keys and defaults as {first}.*"
            shown = "= None" if default is None else "(section)"
            rows.append((key, _type_name(tp), shown, f"{help_text}; {note}" if help_text else note))
            continue
        seen[signature] = key
        if default is None:
            rows.append((key, _type_name(tp), "= None", help_text))
        rows += _rows(section, key, inner, seen)
    return rows


def help_width(width: int | None = None) -> int:
    """``width``, or the terminal's (``COLUMNS`` first; 100 when there is no terminal); at least 40."""
    import shutil

    return max(40, width if width is not None else shutil.get_terminal_size((100, 24)).columns)


def describe(cls: type, width: int | None = None) -> str:
    """Every dotted key of the schema ``cls`` with its type, default and help text, in lines of at
    most ``width`` characters (`help_width`: the terminal's by default).

    A row that fits is one line, ``key  type  = default  # help``, the columns aligned; a longer
    one continues on indented lines (the help as a ``# ...`` paragraph). Long defaults are elided
    (`DEFAULT_SHOWN_MAX`) and a section repeated with the same defaults is listed once.
    """
    import textwrap

    width = help_width(width)
    rows = _rows(cls, "", None)
    kw = max((len(r[0]) for r in rows), default=0)
    tw = max((len(r[1]) for r in rows if len(r[1]) <= 24), default=0)
    stacked = width - kw - 2 < 40          # a narrow terminal: the key on a line of its own
    indent = " " * (4 if stacked else kw + 2)
    avail = width - len(indent)

    def wrap(text: str, subsequent: str = "") -> list[str]:
        return textwrap.wrap(text, avail, subsequent_indent=subsequent, break_on_hyphens=False) or [""]

    lines = []
    for key, tp, default, help_text in rows:
        right = f"{tp:<{tw}}  {default}" if len(tp) <= tw and not stacked else f"{tp}  {default}"
        full = right + (f"  # {help_text}" if help_text else "")
        if not stacked and len(full) <= avail:
            lines.append(f"{key:<{kw}}  {full}".rstrip())
            continue
        if stacked and len(key) + 2 + len(full) <= width:
            lines.append(f"{key}  {full}".rstrip())
            continue
        body = wrap(right, "  ") + (wrap("# " + help_text, "  ") if help_text else [])
        if stacked:
            lines += textwrap.wrap(key, width) + [indent + b for b in body]
        else:
            lines.append(f"{key:<{kw}}  {body[0]}".rstrip())
            lines += [(indent + b).rstrip() for b in body[1:]]
    return "\n".join(lines)
