"""The docs say what the code does: every make target, config key and repository path the
READMEs name exists, the README's lists (keys a resume may change, the layers) are the
code's, and the figures it quotes from a results file are that file's."""

from __future__ import annotations

import dataclasses
import glob
import json
import re
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from dreamer import config, export
from dreamer.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "benchmarks" / "README.md"]
RESULTS = ROOT / "benchmarks" / "results"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SECTIONS = ("run", "replay", "learner", "collector", "eval", "env", "logger", "model", "export")
# a dotted key not preceded by a name, a flag or a path (torch.export.load, --run.steps)
KEY = re.compile(rf"(?<![\w.$/-])((?:{'|'.join(SECTIONS)})(?:\.\w+)+)(\.\*)?(\(?)")
PATH = re.compile(
    r"(?<![\w./~$-])((?:benchmarks|dreamer|tests|conf|slurm)/(?:[\w.<>*/-]|\{[^}\s]*\}|::\w+)*)"
)
# named by the docs but not kept in the checkout, each for its reason
NOT_IN_CHECKOUT = {
    "dreamer/conf/": "conf/ as the wheel ships it",
    "benchmarks/results/gpu": "the GPU check's output folder, made when it runs",
    "benchmarks/results/gpu.json": "the GPU check's result, copied once it has run on a GPU",
}
FILE_SUFFIXES = {"py", "json", "jsonl", "yaml", "md", "sh", "png", "pt", "pt2"}  # replay.py
DERIVED = {  # no default value: the run derives one, as the README's cell says
    "run.logdir": "runs/<env>/<timestamp>",
    "eval.render_workers": "min(usable cores, 16) when the run starts",
}
RETIRED_KEYS = {  # named as history: which option a past measurement ran with
    "learner.imag_starts": "replaced by learner.imag_last; benchmarks/README.md's older rows",
}


def code_of(text: str) -> list[str]:
    """The doc's code: inline spans and the lines of its shell blocks (not its Python)."""
    shell = [body for lang, body in FENCE.findall(text) if lang != "python"]
    prose = FENCE.sub("", text)
    indented = re.findall(r"^ {4}((?:python|make|torchrun|sbatch) .*)$", prose, re.M)
    return [*re.findall(r"`([^`]+)`", prose), *shell, *indented]


def section(text: str, heading: str) -> str:
    """A README section: from its heading to the next heading of any level (a ``#`` line
    inside a code block is a comment, not a heading)."""
    blank = FENCE.sub(lambda block: re.sub(r"[^\n]", " ", block.group(0)), text)
    start = text.index(f"\n{heading}\n")
    end = re.compile(r"^#", re.M).search(blank, start + len(heading) + 2)
    return text[start : end.start() if end else len(text)]


def documented(pattern: re.Pattern) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for code in code_of(doc.read_text()):
            for match in pattern.finditer(code):
                found.setdefault(match.group(0), []).append(doc.relative_to(ROOT).as_posix())
    return found


def leaf_keys() -> set[str]:
    return set(config.flatten(OmegaConf.to_container(config.load([]))))


def test_every_documented_make_target_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {call.split()[1] for call in documented(re.compile(r"(?<!\S)make [a-z][\w-]*"))}
    assert {"train", "test", "smoke", "test-fast"} <= named  # the scan finds them
    assert named <= targets, f"documented but not in the Makefile: {sorted(named - targets)}"


def key_exists(key: str, wildcard: bool) -> bool:
    if key.startswith("export."):
        return key in export.KEYS
    if key.startswith("env."):  # any env kind's key (dreamer/envs/*.py's Settings)
        return key.count(".") == 1 and key.split(".")[1] in config._env_keys(None)
    try:
        kind = config._schema_type(key)
    except ConfigError:
        return False
    return dataclasses.is_dataclass(kind) or not wildcard


def test_every_documented_config_key_exists():
    checked, missing = set(), []
    for doc in DOCS:
        for code in code_of(doc.read_text()):
            for match in KEY.finditer(code):
                key, wildcard, call = match.groups()
                if call or key in RETIRED_KEYS or key.rsplit(".")[-1] in FILE_SUFFIXES:
                    continue  # env.step(...) is a method, learner.py a file
                checked.add(key)
                if not key_exists(key, bool(wildcard)):
                    missing.append(f"{doc.relative_to(ROOT)}: {match.group(0)}")
    assert {"run.steps", "env.task", "learner.loss_scales", "export.path"} <= checked
    assert not missing, "\n".join(missing)
    for key in RETIRED_KEYS:  # history, not a key a user could set
        assert not key_exists(key, False)


def exists(path: str) -> bool:
    """A repository path; ``<name>`` and ``*`` match any name, ``{a,b}`` both, and
    ``file.py::test`` names a test in that file."""
    path, _, test = path.partition("::")
    braces = re.search(r"\{([^}]*)\}", path)
    if braces:
        return all(
            exists(path[: braces.start()] + choice + path[braces.end() :])
            for choice in braces.group(1).split(",")
        )
    found = glob.glob(str(ROOT / re.sub(r"<[^>]*>", "*", path)))
    if test:
        return any(re.search(rf"^def {test}\(", Path(f).read_text(), re.M) for f in found)
    return bool(found)


def test_every_documented_repository_path_exists():
    named: dict[str, set[str]] = {}
    for doc in DOCS:
        for match in PATH.finditer(doc.read_text()):
            path = match.group(1).rstrip(".:")
            named.setdefault(path, set()).add(doc.relative_to(ROOT).as_posix())
    assert "dreamer/envs/registry.py" in named and "benchmarks/gpu_check.sh" in named
    missing = {p: sorted(d) for p, d in named.items() if p not in NOT_IN_CHECKOUT and not exists(p)}
    assert not missing, missing
    for path in NOT_IN_CHECKOUT:  # each exclusion still earns its place
        assert path in named and not exists(path), path


def test_the_readme_lists_exactly_the_keys_a_resume_may_change():
    """The "Only these keys may change on resume" bullet, read as written: every named key,
    `x.*` as every key under x, a key after "but" left out."""
    text = README.read_text()
    start = text.index("- Only these keys may change on resume:")
    bullet = text[start : text.index("Any other change", start)]
    keys, excluded, leaves = set(), set(), leaf_keys()
    for match in re.finditer(r"`([^`]+)`", bullet):
        name = match.group(1)
        named = {k for k in leaves if k.startswith(name[:-1])} if name.endswith(".*") else {name}
        assert named and named <= leaves, name
        before = bullet[: match.start()].rstrip()
        (excluded if before.endswith(" but") else keys).update(named)
    assert keys - excluded == set(config.RESUMABLE_KEYS)


def test_the_readme_layout_is_the_layers_order():
    """ "How it is put together" lists dreamer/'s modules so that each imports only the
    ones above it: the order of tests/test_layout.py's LAYERS, import by import."""
    from tests.test_layout import LAYERS, imported, layer_of

    block = FENCE.search(section(README.read_text(), "## How it is put together")).group(2)
    lines = block.split("\ndreamer/\n")[1].splitlines()
    listed = [m[1] for line in lines if (m := re.match(r"  ([\w.]+/?) ", line + " "))]
    listed = [name.removesuffix("/").removesuffix(".py") for name in listed]
    modules = [f"dreamer.{name}" for name in listed]
    assert set(modules) == set().union(*LAYERS) - {"dreamer"}
    layers = [layer_of(module) for module in modules]
    assert layers == sorted(layers), list(zip(modules, layers, strict=True))
    for position, name in enumerate(listed):
        where = ROOT / "dreamer" / name
        files = sorted(where.rglob("*.py")) if where.is_dir() else [where.with_suffix(".py")]
        for path in files:
            for target in imported(path):
                head = ".".join(target.split(".")[:2])
                if head in modules:
                    assert modules.index(head) <= position, f"{path.name} imports {target}"


def ratio_range(results: dict, env: str) -> str:
    """The chunk-64 async path over torchrl's synchronous Collector, over the models."""
    ratios = [m["chunk64"] / m["stock"] for m in results[env]["models"].values()]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def test_the_collection_ratios_are_those_of_the_results_file():
    results = json.loads((RESULTS / "collect.json").read_text())
    readme = section(README.read_text(), "### Collection")
    assert "benchmarks/results/collect.json" in readme
    for env in ("crafter", "cartpole"):
        assert ratio_range(results, env) in readme, env


def test_the_cpu_speed_figures_are_those_of_their_results_files():
    speed = section(README.read_text(), "### Speed on a CPU")
    learner = json.loads((RESULTS / "learner_pixels12m_cpu.json").read_text())
    assert learner["model"] == "size12m" and (learner["batch"], learner["length"]) == (16, 64)
    seconds = 1 / learner["modes"]["fused"]["updates_per_s"]  # the CPU's default learner
    assert "benchmarks/results/learner_pixels12m_cpu.json" in speed
    assert f"~{seconds:.0f} s" in speed
    cartpole = json.loads((RESULTS / "cartpole_compiled_seed0.json").read_text())
    assert cartpole["overrides"] == ["experiment=cartpole"]  # the preset as it is
    assert "benchmarks/results/cartpole_compiled_seed0.json" in speed
    assert f"{cartpole['seconds_per_seed'][0]:,} s" in speed
    assert f"{cartpole['final_mean']:.0f}" in speed and cartpole["date"] in speed
    before = json.loads((RESULTS / "cartpole.json").read_text())  # three seeds at once
    seconds = sorted(before["seconds_per_seed"])
    assert "benchmarks/results/cartpole.json" in speed and before["date"] in speed
    assert f"{seconds[0]:,}-{seconds[-1]:,} s" in speed


def gpu_check_steps() -> dict[str, int]:
    """benchmarks/gpu_check.sh's steps on the GPU and their limits in seconds."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    steps = {name: int(limit) for name, limit in re.findall(r"^step (\w+) (\d+) ", script, re.M)}
    gpu = script.split("\nelse\n", 1)[1]  # the branch that is not the dry run
    shapes = re.search(r"LEARNER_SHAPES=\(([^)]*)\)", gpu).group(1)
    limits = [int(n) for n in re.findall(r'learner "\$\{shape\[@\]\}" (\d+)', script)]
    # the first shape runs under the first learner limit, the second under the second,
    # the rest (in what the budget has left) under the last
    for index, shape in enumerate(re.findall(r'"([^"]+)"', shapes)):
        model, batch, length, _ = shape.split()
        steps[f"learner-{model}-{batch}x{length}"] = limits[min(index, len(limits) - 1)]
    return steps


def test_the_gpu_check_table_lists_the_scripts_steps_and_limits():
    text = section(
        (ROOT / "benchmarks" / "README.md").read_text(),
        "## The GPU check (`benchmarks/gpu_check.sh`)",
    )
    rows = dict(re.findall(r"^\| `([\w-]+)` \|.*\| (\d+) \|$", text, re.M))
    assert {name: int(limit) for name, limit in rows.items()} == gpu_check_steps()
    budget = re.search(
        r"GPU_CHECK_SECONDS:-\$\(\((\d+) \*", (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    )
    assert f"{budget.group(1)} s" in text


NAMED_IN = re.compile(
    r"`((?:benchmarks|dreamer|tests)/[\w/]+\.py)`'s `(\w+)`|`(\w+)` in `([\w/]+\.py)`"
)


def test_every_name_the_docs_place_in_a_file_is_defined_there():
    """ "`dreamer/data/collect.py`'s `MEASURED`" outlived the table it named (the trainer's
    note lost its figures and the test that kept them equal to results/collect.json)."""
    named = []
    for doc in DOCS:
        for match in NAMED_IN.finditer(doc.read_text()):
            path, name = (match[1], match[2]) if match[1] else (match[4], match[3])
            named.append((doc.relative_to(ROOT).as_posix(), path, name))
    assert ("README.md", "dreamer/config.py", "RESUMABLE_KEYS") in named
    for doc, path, name in named:
        source = (ROOT / path).read_text()
        defined = rf"^\s*(?:def |class )?{name}\b\s*[(:=]"
        assert re.search(defined, source, re.M), f"{doc}: {path} defines no {name}"


def cell_value(cell: str):
    """A README default cell as a value: ``none`` is None, a backticked or bare literal is
    read as YAML (``1,000,000`` without its commas), an explanation in brackets dropped."""
    cell = cell.split(" (")[0].strip()
    if cell == "none":
        return None
    literal = cell.strip("`")
    return yaml.safe_load(
        literal.replace(",", "") if re.fullmatch(r"[\d,.]+", literal) else literal
    )


def same(documented, actual) -> bool:
    return documented == actual and isinstance(documented, bool) == isinstance(actual, bool)


def test_the_readmes_default_columns_are_what_a_run_gets():
    """Every `| key | default | meaning |` table of the README against `--cfg job` without
    overrides (Crafter, size12m): a second copy of the schema's defaults that must agree."""
    run = config.flatten(OmegaConf.to_container(config.load([])))
    run["logger"] = run["logger.use"]  # the `logger=[...]` shorthand's row
    rows, header = [], False
    for line in README.read_text().splitlines():
        if line.startswith("| key | default |"):
            header = True
        elif not line.startswith("|"):
            header = False
        elif header and not line.startswith("|---"):
            rows.append(line.split(" | ")[:2])
    checked = set()
    for keys_cell, default_cell in rows:
        keys = re.findall(r"`([^`]+)`", keys_cell)
        if keys == ["learner.loss_scales.*"]:  # `rec` 1, `rew` 1, ...: a value per term
            pairs = re.findall(r"`(\w+)` ([\d.]+)", default_cell)
            values = {f"learner.loss_scales.{name}": float(v) for name, v in pairs}
        else:
            cells = default_cell.split(", ") if len(keys) > 1 else [default_cell]
            cells = cells * len(keys) if len(cells) == 1 else cells  # one value for all
            values = {key: cell_value(cell) for key, cell in zip(keys, cells, strict=True)}
        for key, value in values.items():
            checked.add(key)
            if key in DERIVED:
                assert run[key] is None or key == "run.logdir", key
                continue
            assert same(value, run[key]), f"README: {key} {value!r}, a run gets {run[key]!r}"
    assert {"run.steps", "collector.inference.timeout", "logger.wandb.entity"} <= checked
    assert "learner.loss_scales.repval" in checked


def test_the_minedojo_keys_defaults_are_what_env_minedojo_gets():
    text = section(README.read_text(), "### MineDojo")
    env = OmegaConf.to_container(config.load(["env=minedojo"]).env)
    documented = dict(re.findall(r"`env\.(\w+)`\s+\((\d+)", text))
    assert {"max_steps", "image_size", "launch_timeout"} <= set(documented)
    for key, value in documented.items():
        assert float(value) == env[key], (
            f"README: env.{key} ({value}), env=minedojo gets {env[key]}"
        )
