"""The package's layout: subpackages along the data's way, each importing only the
layers below it, so a folder's name says where a thing lives and nothing imports upward."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import dreamer

PACKAGE = Path(dreamer.__file__).parent
# lowest first; a module may import its own layer and the layers before it
LAYERS = [
    {"dreamer.errors", "dreamer.schema", "dreamer.torchrl_compat"},
    {"dreamer.runtime"},
    {"dreamer.agent"},
    {"dreamer.envs"},
    {"dreamer.config", "dreamer.command_line", "dreamer.key_reference"},
    {"dreamer.outputs"},
    {"dreamer.data", "dreamer.learning", "dreamer.serving"},
    {"dreamer.evaluation"},
    {"dreamer.training"},
    {"dreamer", "dreamer.train", "dreamer.evaluate", "dreamer.export"},  # the commands
]


def layer_of(module: str) -> int:
    for depth in (2, 1):
        head = ".".join(module.split(".")[:depth])
        for index, layer in enumerate(LAYERS):
            if head in layer:
                return index
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every dreamer module ``path`` imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "dreamer":
            names |= {f"dreamer.{alias.name}" for alias in node.names if alias.name != "Policy"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return {name for name in names if name == "dreamer" or name.startswith("dreamer.")}


def test_every_module_sits_in_a_layer_and_imports_no_layer_above_its_own():
    upward = []
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40
    for path in modules:
        name = module_name(path)
        own = layer_of(name)
        for target in imported(path):
            assert importlib.util.find_spec(target), f"{name} imports {target}, which is gone"
            if layer_of(target) > own:
                upward.append(f"{name} imports {target}")
    assert not upward, "\n".join(upward)


def test_the_package_top_holds_only_the_commands_the_config_and_the_errors():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    commands = {"__init__", "train", "evaluate", "export"}
    rooms = {"config", "command_line", "key_reference", "errors", "schema", "torchrl_compat"}
    assert top == commands | rooms
    for folder in (p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert docstring, f"{folder.name}/__init__.py says what the folder holds"


def test_the_wheel_lists_every_folder_of_the_package():
    """setuptools is given the packages by name (conf/ maps to dreamer.conf): a new
    folder missing from pyproject.toml would be left out of the wheel."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    folders = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
    conf = PACKAGE.parent / "conf"
    presets = {
        ".".join(("dreamer.conf", *folder.relative_to(conf).parts))
        for folder in [conf, *conf.rglob("*")]
        if folder.is_dir()
    }
    assert listed == folders | presets
    assert project["tool"]["setuptools"]["package-dir"] == {"dreamer.conf": "conf"}


def test_nothing_in_benchmarks_imports_the_tests():
    """benchmarks/ answers users' questions from the package alone: what a benchmark and
    a test both need lives once, where the benchmark can import it (tests may import
    from benchmarks/, never the other way round)."""
    scripts = sorted((PACKAGE.parent / "benchmarks").rglob("*.py"))
    assert len(scripts) > 10
    found = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert not found, "\n".join(found)
