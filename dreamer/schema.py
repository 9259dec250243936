"""The schema's building blocks: a field with its check, and the checks themselves.

Every configuration dataclass (``dreamer/config.py``'s sections, each env's settings in
``dreamer/envs/``) declares its fields with ``f``: a default, a range ``check`` ('>= 1',
'> 0', '[0, 1)') and allowed string ``choices``; ``check_section`` applies them. The
string right under a field is its meaning (``field_docs``), as cleanrl writes them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import shlex
import sys
import textwrap
import typing
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from omegaconf import MISSING

from dreamer.errors import ConfigError

TRISTATE = ("auto", "true", "false")
TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}


def f(
    default: Any = MISSING,
    check: str | None = None,
    choices: tuple[str, ...] = (),
    resumable: bool = False,
) -> Any:
    """A schema field; ``check``: '>= 1', '> 0', '[0, 1)', ...; ``choices``: allowed strings;
    ``resumable``: a resumed run may set it anew (every other key is its run's)."""
    metadata = {"check": check, "choices": choices, "resumable": resumable}
    return field(default=default, metadata=metadata)


def strings(default: list[str], resumable: bool = False) -> Any:
    """A list-of-strings schema field."""
    metadata = {"check": None, "choices": (), "resumable": resumable}
    return field(default_factory=lambda: list(default), metadata=metadata)


def section(kind: type, resumable: bool = False) -> Any:
    """A nested section of the schema; ``resumable``: every key of it (see ``f``)."""
    return field(default_factory=kind, metadata={"resumable": resumable})


def mapping() -> Any:
    """A free mapping (e.g. keyword arguments handed on as they are)."""
    return field(default_factory=dict, metadata={"check": None, "choices": ()})


def in_range(value: float, check: str) -> bool:
    """``check`` is '>= b', '> b' or an interval such as '[0, 1)' or '(0, 1]'."""
    if check[0] == ">":
        op, bound = check.split()
        return value >= float(bound) if op == ">=" else value > float(bound)
    lo, hi = (float(x) for x in check[1:-1].split(","))
    above = value >= lo if check[0] == "[" else value > lo
    return above and (value <= hi if check[-1] == "]" else value < hi)


def check_field(key: str, value: Any, metadata: Mapping) -> None:
    choices, check = metadata["choices"], metadata["check"]
    if choices and value not in choices:
        raise ConfigError(f"{key}: unknown option {value!r}; allowed: {', '.join(choices)}")
    if check and value is not None and not in_range(value, check):
        bound = check if check[0] == ">" else f"in {check}"
        raise ConfigError(f"{key}: must be {bound}, got {value}")


def check_section(prefix: str, cls: type, node) -> None:
    """Every field of ``node`` (a DictConfig of dataclass ``cls``) against its metadata."""
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        kind = hints[item.name]
        if dataclasses.is_dataclass(kind):
            check_section(f"{prefix}.{item.name}", kind, node[item.name])
            continue
        if item.metadata["choices"] == TRISTATE:  # Hydra reads `true` as a boolean: 'True'
            node[item.name] = str(node[item.name]).lower()
        check_field(f"{prefix}.{item.name}", node[item.name], item.metadata)


def pip_install(extra: str) -> str:
    """The command that installs the project's ``extra`` into this interpreter's
    environment: its pip by path, which works without the venv active or inside make."""
    return f"{shlex.quote(sys.executable or 'python')} -m pip install -e '.[{extra}]'"


def installed(module: str) -> bool:
    """Is ``module`` importable here (a package an env or tracker needs)?"""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: imports of it are blocked
        return False


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it) in ``cls`` and its bases,
    as one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):  # a subclass's own word wins
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def allowed(kind: Any, metadata: Mapping) -> str:
    """What a field takes, in words: its choices, its range, or its type."""
    if metadata["choices"]:
        return ", ".join(metadata["choices"])
    if metadata["check"]:
        return metadata["check"]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = typing.get_origin(kind) or kind
    if base in (list, dict):
        return "list of strings" if base is list else "mapping"
    name = TYPE_NAMES.get(args[0] if args else kind, "a value").split(" ", 1)[1]
    return f"{name} or none" if type(None) in typing.get_args(kind) else name
