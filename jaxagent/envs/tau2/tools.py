"""tau2-bench tools, the parts every domain shares (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``: a tool's
refusal is tau2's exact message (`ToolError`, a ``ValueError`` as tau2 raises), `run_tool` turns
one call into the tool message content and never raises (an unknown name, arguments that are not
an object, any exception of the call -> ``"Error: ..."``), `render` formats a successful result,
`calculate` is tau2's ``calculate`` tool (its ``eval`` reproduced by walking the AST), and
`check_schemas` checks a domain's served schemas against its toolkit's methods. A domain's toolkit
(`jaxagent.envs.tau2.domains`) is a class over the plain-dict database with one method per tool.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CALCULATE_CHARS", "CALCULATE_MAX_INT_BITS", "MAKE_TOOL_CALL", "ToolError", "ToolResult", "calculate",
           "check_schemas", "make_tool_call_error", "render", "run_tool", "schema_file_text"]

CALCULATE_CHARS = "0123456789+-*/(). "
CALCULATE_MAX_INT_BITS = 1_000_000
"""``calculate`` refuses an integer product or power that would exceed this many bits (tau2's bare
``eval`` would hang on ``9**9**9``). Below it, Python's exact integer arithmetic runs as in tau2, so
``2 ** 200000 // 2 ** 199990`` is ``1024.0`` and ``2 ** 100001`` fails as in tau2 (``int too large to
convert to float``); at the limit one floor division of such integers takes about a second."""


class ToolError(ValueError):
    """A tool's refusal; ``str(exc)`` is tau2's exact message (tau2 raises ``ValueError``)."""


@dataclass(frozen=True)
class ToolResult:
    """One tool message: ``content`` as the agent sees it, ``error`` true when the call failed."""
    content: str
    error: bool


# --------------------------------------------------------------------------------------------------
# calculate: tau2 evaluates the whitelisted text with eval(); here the same Python semantics come from
# walking the AST with the same operators, so values and error texts match without running eval.

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARYOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Star:
    """A ``*value`` call argument, evaluated."""
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _guard_size(op: type, left: Any, right: Any) -> None:
    if type(left) is not int or type(right) is not int:
        return
    if op is ast.Pow:
        too_big = right > 0 and abs(left) > 1 and (abs(left).bit_length() - 1) * right > CALCULATE_MAX_INT_BITS
    else:
        too_big = op is ast.Mult and left.bit_length() + right.bit_length() > CALCULATE_MAX_INT_BITS + 1
    if too_big:
        raise ToolError(f"Result too large to calculate: an integer of more than {CALCULATE_MAX_INT_BITS} bits")


def _evaluate(expression: str) -> Any:
    """Python's value of an arithmetic expression made of ``CALCULATE_CHARS``, with Python's errors.

    Parsed by :func:`ast.parse` (syntax errors carry the same ``(<string>, line 1)`` text as
    ``eval``), then evaluated iteratively (deep ``1+1+...`` chains work as in ``eval``). Only the
    node types these characters can form are accepted: numbers, ``...``, ``()``, unary +/-, the
    seven binary operators and calls (which always fail, as nothing callable exists).
    """
    if not isinstance(expression, str):
        raise TypeError("eval() arg 1 must be a string, bytes or code object")
    tree = ast.parse(expression.lstrip(" \t"), filename="<string>", mode="eval")
    values: list[Any] = []
    # (node, expanded, immediate_star): immediate_star marks a *arg that Python checks on the spot.
    stack: list[tuple[ast.AST, bool, bool]] = [(tree.body, False, False)]
    while stack:
        node, expanded, immediate_star = stack.pop()
        kind = type(node)
        if kind is ast.Constant:
            if not (type(node.value) in (int, float) or node.value is Ellipsis):
                raise ToolError(f"Unsupported constant in expression: {node.value!r}")
            values.append(node.value)
        elif kind is ast.Tuple:
            if not expanded:
                if any(isinstance(e, ast.Starred) for e in node.elts):
                    raise ToolError("Unsupported expression")
                stack.append((node, True, False))
                stack.extend((e, False, False) for e in reversed(node.elts))
            else:
                n = len(node.elts)
                items = tuple(values[len(values) - n:]) if n else ()
                del values[len(values) - n:]
                values.append(items)
        elif kind is ast.UnaryOp and type(node.op) in _UNARYOPS:
            if not expanded:
                stack.append((node, True, False))
                stack.append((node.operand, False, False))
            else:
                values.append(_UNARYOPS[type(node.op)](values.pop()))
        elif kind is ast.BinOp and type(node.op) in _BINOPS:
            if not expanded:
                stack.append((node, True, False))
                stack.append((node.right, False, False))
                stack.append((node.left, False, False))
            else:
                right = values.pop()
                left = values.pop()
                _guard_size(type(node.op), left, right)
                values.append(_BINOPS[type(node.op)](left, right))
        elif kind is ast.Starred:
            if not expanded:
                stack.append((node, True, immediate_star))
                stack.append((node.value, False, False))
            else:
                value = values.pop()
                if immediate_star and not isinstance(value, tuple):
                    raise TypeError(f"Value after * must be an iterable, not {type(value).__name__}")
                values.append(_Star(value))
        elif kind is ast.Call:
            if any(k.arg is not None for k in node.keywords):
                raise ToolError("Unsupported expression")
            has_double_star = bool(node.keywords)
            lone_star = len(node.args) == 1 and isinstance(node.args[0], ast.Starred)
            if not expanded:
                immediate = not has_double_star and not lone_star
                stack.append((node, True, False))
                stack.extend((k.value, False, False) for k in reversed(node.keywords))
                stack.extend((a, False, immediate) for a in reversed(node.args))
                stack.append((node.func, False, False))
            else:
                n = len(node.args) + len(node.keywords)
                operands = values[len(values) - n:] if n else []
                del values[len(values) - n:]
                func = values.pop()
                args, kwargs = operands[:len(node.args)], operands[len(node.args):]
                if kwargs:   # nothing these characters can build is a mapping
                    raise TypeError(f"{func} argument after ** must be a mapping, not {type(kwargs[0]).__name__}")
                for arg in args:
                    if isinstance(arg, _Star) and not isinstance(arg.value, tuple):
                        raise TypeError(f"{func} argument after * must be an iterable, "
                                        f"not {type(arg.value).__name__}")
                raise TypeError(f"'{type(func).__name__}' object is not callable")
        else:
            raise ToolError(f"Unsupported expression element: {kind.__name__}")
    return values.pop()


def calculate(expression: str) -> str:
    """tau2's ``calculate``: the expression's value rounded to 2 decimals, as a string; only
    `CALCULATE_CHARS` are allowed."""
    if not all(c in CALCULATE_CHARS for c in expression):
        raise ToolError("Invalid characters in expression")
    return str(round(float(_evaluate(expression)), 2))


# --------------------------------------------------------------------------------------------------
# rendering

def render(value: Any) -> str:
    """Tool-message content of a successful result: a string unchanged, anything else as one-line JSON.

    Records keep their stored (canonical) field order, nulls included; separators ``", "`` and
    ``": "``; non-ASCII escaped; floats in repr form.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value)


MAKE_TOOL_CALL = "tau2.environment.environment.Environment.make_tool_call()"
"""tau2 runs every call as ``Environment.make_tool_call(name, requestor=requestor, **arguments)``
(``environment/environment.py``), so an argument named like one of its own parameters fails there,
before any tool lookup, with Python's binding error (`make_tool_call_error`)."""


def make_tool_call_error(arguments: Mapping[str, Any]) -> str | None:
    """The tool message tau2 gives when ``arguments`` (an object) holds a key that collides with
    ``make_tool_call``'s parameters (``self``, ``tool_name``, ``requestor``), else None: Python reports
    ``requestor`` (given twice at the call site) first, then the first of ``self`` / ``tool_name`` in
    argument order."""
    if "requestor" in arguments:
        return f"Error: {MAKE_TOOL_CALL} got multiple values for keyword argument 'requestor'"
    for key in arguments:
        if key in ("self", "tool_name"):
            return f"Error: Environment.make_tool_call() got multiple values for argument '{key}'"
    return None


def run_tool(toolkit: Any, names: Collection[str], name: str, arguments: Any, *,
             render: Callable[[Any], str] = render) -> ToolResult:
    """Run one tool call on ``toolkit`` (a domain's toolkit over the live database, mutated in place
    by write tools); never raises.

    Arguments that are not an object -> an error saying so; an argument named ``self``, ``tool_name``
    or ``requestor`` -> tau2's ``make_tool_call`` error (`make_tool_call_error`, before any lookup); a
    name outside ``names`` -> ``Error: Tool '<name>' not found.``; any exception of the call (tau2's messages, Python's argument errors, ...)
    -> ``"Error: " + str(exc)``; otherwise the result rendered by ``render`` (default `render`; a domain
    whose results render differently passes its own) with ``error=False``.
    """
    if not isinstance(arguments, dict):
        return ToolResult(f"Error: the arguments of {name} must be a JSON object mapping parameter names "
                          f"to values, got {type(arguments).__name__} {arguments!r:.80}", True)
    collision = make_tool_call_error(arguments)
    if collision is not None:
        return ToolResult(collision, True)
    if not isinstance(name, str) or name not in names:
        return ToolResult(f"Error: Tool '{name}' not found.", True)
    try:
        result = getattr(toolkit, name)(**arguments)
    except Exception as exc:   # noqa: BLE001 — every failure becomes a tool message, as in tau2
        return ToolResult("Error: " + str(exc), True)
    return ToolResult(render(result), False)


_PARAM_TYPES: dict[str, dict[str, Any]] = {"str": {"type": "string"},
                                           "list[str]": {"type": "array", "items": {"type": "string"}}}
"""Method annotation -> the JSON-schema type keys it must have in the file."""


def check_schemas(schemas: Any, toolkit_cls: type, names: Collection[str],
                  param_types: dict[str, dict[str, Any]] | None = None) -> None:
    """Raise ``ValueError`` unless ``schemas`` describe exactly the tools ``names`` of ``toolkit_cls``.

    Each name once (any order); each tool's parameters are its method's, in signature order, the
    required ones exactly those without a default (tau2 omits ``required`` when there is none), an
    optional one's schema ``default`` equal to the method's, and each parameter's ``type`` (and
    ``items``) fits its annotation (``param_types``: annotation text -> schema keys; default str and
    list[str]). Descriptions are not checked: they are whatever tau2 wrote.
    """
    types = param_types or _PARAM_TYPES
    if not isinstance(schemas, (list, tuple)):
        raise ValueError(f"tool schemas: expected a list, got {type(schemas).__name__}")  # noqa: TRY004 (a bad file)
    got = sorted(str(s.get("function", {}).get("name")) if isinstance(s, dict) else repr(s) for s in schemas)
    if got != sorted(names):
        raise ValueError(f"tool schemas name {got}, the implemented tools are {sorted(names)}")
    for schema in schemas:
        fn = schema["function"]
        name, params = fn["name"], fn.get("parameters", {})
        if schema.get("type") != "function" or params.get("type") != "object":
            raise ValueError(f"tool schema {name}: not a function schema with an object of parameters")
        signature = inspect.signature(getattr(toolkit_cls, name)).parameters
        wanted = [p for p in signature if p != "self"]
        required = [p for p in wanted if signature[p].default is inspect.Parameter.empty]
        props = params.get("properties", {})
        if list(props) != wanted or params.get("required", []) != required:
            raise ValueError(f"tool schema {name}: parameters {list(props)} (required "
                             f"{params.get('required', [])}) differ from the method's {wanted} (required {required})")
        for p in wanted:
            annotation = str(signature[p].annotation)
            expected = types.get(annotation)
            if expected is None or any(props[p].get(k) != v for k, v in expected.items()):
                raise ValueError(f"tool schema {name}: parameter {p} is {props[p].get('type')!r} "
                                 f"(items {props[p].get('items')!r}), the method takes {annotation}")
            default = signature[p].default
            if default is not inspect.Parameter.empty and props[p].get("default", inspect.Parameter.empty) != default:
                raise ValueError(f"tool schema {name}: parameter {p} defaults to {props[p].get('default')!r}, "
                                 f"the method's default is {default!r}")


@functools.cache
def schema_file_text(path: Path, check: Callable[[Any], None]) -> str:
    """The ``tools`` list of a domain's ``tool_schemas.json`` (``{"source": ..., "tools": [...]}``,
    tau2's schemas as its code generates them) as JSON text, read and checked (``check``) once per
    file; a domain serves ``tuple(json.loads(text))``, fresh objects on every call."""
    tools = json.loads(path.read_text(encoding="utf-8"))["tools"]
    check(tools)
    return json.dumps(tools)
