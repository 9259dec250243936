"""Every configuration key's meaning, default and allowed values, from one source: the
schema (``dreamer/config.py``'s sections, each env kind's ``Settings``), whose field
docstrings are the meanings. ``python -m dreamer.train --help`` prints them;
``docs/configuration.md``'s key tables are ``markdown()`` (``make docs`` writes them,
``tests/test_docs.py`` holds the file to it). Also train's command line (``from_argv``).
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import MISSING, DictConfig, OmegaConf

from dreamer.command_line import USAGE
from dreamer.config import GROUPS, Config, group_defaults, options
from dreamer.envs import registry
from dreamer.schema import allowed, field_docs

GENERATED = "<!-- the key tables below: python -m dreamer.key_reference (make docs) -->"
END = "<!-- end of the key tables -->"
COLUMN = 34  # --help: where the meanings start
NBSP = "\u00a0"


class Key(NamedTuple):
    key: str
    default: str
    allowed: str
    meaning: str


def shown(value: Any, unset: str) -> str:
    """A default as a user writes it on the command line."""
    if value is MISSING:
        return unset
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return f"[{','.join(map(str, value))}]"
    return str(value)


def keys_of(cls: type, prefix: str, values: DictConfig | None = None, unset: str = "") -> list[Key]:
    """The leaf keys of section ``cls`` (nested sections not included), with their
    defaults from ``values`` (a preset over the schema) or the schema's own."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    found = []
    for item in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[item.name]) or item.name == "name":
            continue  # a section, or the env= / model= option itself
        if values is not None:
            value = MISSING if OmegaConf.is_missing(values, item.name) else values[item.name]
            value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            value = item.default
        meaning = docs.get(item.name, "")
        kind = allowed(hints[item.name], item.metadata)
        found.append(Key(f"{prefix}.{item.name}", shown(value, unset), kind, meaning))
    return found


def sections() -> list[tuple[str, str, list[Key]]]:
    """(title, what the section is, its keys) for every section: one per env option
    (its kind's keys with the option's values), the model keys, then the others."""
    found = []
    for option in options("env"):
        node = group_defaults("env", option)
        cls = registry.settings(node.name)
        title = f"env={option}"
        found.append((title, _first_line(cls), keys_of(cls, "env", node, "required")))
    model = typing.get_type_hints(Config)["model"]
    unset = "per model="
    found.append(("model", _first_line(model), keys_of(model, "model", unset=unset)))

    def walk(cls: type, prefix: str) -> None:
        found.append((prefix, _first_line(cls), keys_of(cls, prefix)))
        for name, kind in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(kind):
                walk(kind, f"{prefix}.{name}")

    for name, kind in typing.get_type_hints(Config).items():
        if name not in ("env", "model"):
            walk(kind, name)
    return found


def _first_line(cls: type) -> str:
    """A section's description: its class docstring's first paragraph, plain."""
    doc = cls.__doc__ or ""
    if doc.startswith(cls.__name__ + "("):  # dataclass's generated signature: none written
        return ""
    return " ".join(doc.split("\n\n")[0].split()).replace("``", "")


def model_presets() -> list[str]:
    """``model=<preset>: key=value ...`` per preset (what ``model=`` sets)."""
    lines = []
    for option in options("model"):
        node = group_defaults("model", option)
        values = " ".join(f"{k}={shown(node[k], '')}" for k in node if k != "name")
        lines.append(f"model={option}: {values}")
    return lines


def usage() -> str:
    """``--help``: the groups with their options, then every key with its default, what
    it allows and what it means, section by section."""
    lines = [USAGE, "", "groups (group=option):"]
    lines += [f"  {g:<11} {' | '.join(options(g))}" for g in GROUPS]
    lines += [
        "",
        "keys (section.key=value): the default a run gets [what is allowed] and the meaning;",
        "env keys per env= option; experiment= presets set some anew",
    ]
    for title, about, keys in sections():
        lines += [""] + textwrap.wrap(f"{title}: {about}", width=100, subsequent_indent="  ")
        if title == "model":
            for line in model_presets():
                lines += textwrap.wrap(
                    line, width=100, initial_indent="  ", subsequent_indent="    "
                )
        for key in keys:
            head = f"  {key.key}={key.default}"
            # the allowed values unbroken: textwrap breaks at spaces, not at NBSPs
            text = f"{key.meaning} [{key.allowed.replace(' ', NBSP)}]".lstrip()
            indent = " " * COLUMN
            if len(head) >= COLUMN:
                lines.append(head)
                head = ""
            wrapped = textwrap.wrap(
                text,
                width=100,
                initial_indent=f"{head:<{COLUMN}}",
                subsequent_indent=indent,
                break_on_hyphens=False,
            )
            lines += [line.replace(NBSP, " ") for line in wrapped]
    lines += ["", "--cfg job   print the resolved config as YAML and exit"]
    lines += ["-m          a sweep: key=a,b runs a job per value (hydra/launcher=slurm: on SLURM)"]
    return "\n".join(lines)


def markdown() -> str:
    """docs/configuration.md's key tables."""
    lines = []
    for title, about, keys in sections():
        lines += ["", f"### {title}", ""]
        if about:
            lines += [about, ""]
        if title == "model":
            lines += [f"- `{line}`" for line in model_presets()] + [""]
        lines += ["| key | default | allowed | meaning |", "|---|---|---|---|"]
        lines += [f"| `{k.key}` | {k.default} | {k.allowed} | {k.meaning} |" for k in keys]
    return "\n".join([GENERATED, *lines, "", END])


def write(path: str) -> None:
    """Replace the key tables in the markdown file at ``path`` with ``markdown()``."""
    text = Path(path).read_text()
    start, end = text.index(GENERATED), text.index(END) + len(END)
    Path(path).write_text(text[:start] + markdown() + text[end:])


if __name__ == "__main__":  # make docs
    if sys.argv[1:2] == ["--write"]:
        write(sys.argv[2])
    else:
        print(markdown())
