"""The docs say what the code does: every make target, config key and repository path the
docs name exists, their lists (keys a resume may change, the layers) are the code's, the
key tables are the schema's (one source with --help), and the figures they quote from a
results file are that file's."""

from __future__ import annotations

import dataclasses
import glob
import json
import re
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from dreamer import config, export
from dreamer.command_line import load
from dreamer.errors import ConfigError
from dreamer.training.resume import RESUMABLE_KEYS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC = ROOT / "docs"
DOCS = [README, *sorted(DOC.glob("*.md")), ROOT / "benchmarks" / "README.md"]
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
DERIVED = {  # no default value: the run derives one, as its meaning says
    "run.logdir": "runs/<env>/<timestamp>",
    "eval.render_workers": "min(usable cores, 16) when the run starts",
}
RETIRED_KEYS = {  # named as history: which option a past measurement ran with
    "learner.imag_starts": "replaced by learner.imag_last; benchmarks/README.md's older rows",
    "learner.rollout": "removed with the one update (REMOVED_KEYS); older rows, the docs' note",
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
    return set(config.flatten(OmegaConf.to_container(load([]))))


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
        kind = config.schema_type(key)
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
    text = (DOC / "reliability.md").read_text()
    start = text.index("- Only these keys may change on resume:")
    bullet = text[start : text.index("Any other change", start)]
    keys, excluded, leaves = set(), set(), leaf_keys()
    for match in re.finditer(r"`([^`]+)`", bullet):
        name = match.group(1)
        named = {k for k in leaves if k.startswith(name[:-1])} if name.endswith(".*") else {name}
        assert named and named <= leaves, name
        before = bullet[: match.start()].rstrip()
        (excluded if before.endswith(" but") else keys).update(named)
    assert keys - excluded == set(RESUMABLE_KEYS)


def test_the_readme_layout_is_the_layers_order():
    """ "How it is put together" lists dreamer/'s modules so that each imports only the
    ones above it: the order of tests/test_layout.py's LAYERS, import by import."""
    from tests.test_layout import LAYERS, imported, layer_of

    block = FENCE.search((DOC / "design.md").read_text()).group(2)
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
    readme = (DOC / "collection.md").read_text().split("\n## ")[0]
    assert "benchmarks/results/collect.json" in readme
    for env in ("crafter", "cartpole"):
        assert ratio_range(results, env) in readme, env


def test_the_cpu_speed_figures_are_those_of_their_results_files():
    speed = section((DOC / "collection.md").read_text(), "## Speed on a CPU")
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


def test_the_cpu_runs_length_is_said_once_as_measured():
    """README, docs/envs.md, the preset and the start note give experiment=dmc_proprio_cpu
    one length (they said half an hour, 25-35 min, about an hour and ~1 h): the
    constant, the mean wall time of ours' seeds in the side-by-side results."""
    from dreamer.runtime.timing import CPU_RUN_LENGTH, CpuSpeedNote

    runs = json.loads((RESULTS / "peers_learn_reacher_easy.json").read_text())
    minutes = runs["summary"]["ours"]["mean_wall_s"] / 60
    assert runs["preset"] == "experiment=dmc_proprio_cpu"
    assert CPU_RUN_LENGTH == f"about {5 * round(minutes / 5)} min on 2 cores"
    places = {
        "README.md": (ROOT / "README.md").read_text(),
        "docs/envs.md": (DOC / "envs.md").read_text(),
        "the preset": (ROOT / "conf/experiment/dmc_proprio_cpu.yaml").read_text(),
    }
    crafter = load(["run.steps=1000000"])
    places["the start note"] = CpuSpeedNote(crafter, True).note(5.0, "timed")
    others = re.compile(r"half an hour|an hour|~1 h\b|\d+-\d+ min")
    for place, text in places.items():
        text = " ".join(text.split())
        assert CPU_RUN_LENGTH in text and not others.search(text), place


def test_the_metrics_table_is_the_one_source():
    """docs/outputs.md lists the metrics as dreamer/outputs/metric_keys.py holds them
    (the runs' tests hold every key a run writes to that module)."""
    from dreamer.outputs.metric_keys import table

    text = (DOC / "outputs.md").read_text()
    assert table() in text


def gpu_check_steps() -> dict[str, int]:
    """benchmarks/gpu_check.sh's steps on the GPU and their limits in seconds."""
    script = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    steps = {name: int(limit) for name, limit in re.findall(r"^ *step (\w+) (\d+) ", script, re.M)}
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
    assert ("docs/reliability.md", "dreamer/training/resume.py", "RESUMABLE_KEYS") in named
    for doc, path, name in named:
        source = (ROOT / path).read_text()
        defined = rf"^\s*(?:def |class )?{name}\b\s*[(:=]"
        assert re.search(defined, source, re.M), f"{doc}: {path} defines no {name}"


def table_rows(text: str) -> list[str]:
    """The rows of every `| key | default | allowed | meaning |` table in ``text``."""
    rows, header = [], False
    for line in text.splitlines():
        if line.startswith("| key | default | allowed | meaning |"):
            header = True
        elif not line.startswith("|"):
            header = False
        elif header and not line.startswith("|---"):
            rows.append(line)
    return rows


def test_the_key_tables_are_the_schemas():
    """docs/configuration.md's tables are key_reference.markdown() (make docs), and the
    README's key table is rows of them: one source, the schema's docstrings."""
    from dreamer import key_reference

    text = (DOC / "configuration.md").read_text()
    start, end = text.index(key_reference.GENERATED), text.index(key_reference.END)
    assert text[start : end + len(key_reference.END)] == key_reference.markdown(), "make docs"
    generated = set(table_rows(key_reference.markdown()))
    readme = table_rows(README.read_text())
    assert len(readme) >= 5 and set(readme) <= generated, set(readme) - generated


def test_every_key_is_documented_and_its_default_is_what_a_run_gets():
    """Every key of every section and env option has a meaning, and the default the
    reference shows is what `--cfg job` gives (per env option; the model's per preset)."""
    from dreamer import key_reference

    found = {}
    for title, _, keys in key_reference.sections():
        option = title.split("=")[1] if title.startswith("env=") else None
        for key in keys:
            assert key.meaning, f"{title}: {key.key} has no docstring"
            found[(option, key.key)] = key.default
    for option in [None, *config.options("env")]:
        overrides = [f"env={option}"] if option else []
        overrides += ["env.id=Acrobot-v1"] if option == "gym" else []  # gym has no default id
        run = config.flatten(OmegaConf.to_container(load(overrides)))
        for key, value in run.items():
            if key == "env.name" or key.startswith("model."):
                continue
            where = (option or "crafter") if key.startswith("env.") else None
            shown = found.get((where, key))
            assert shown is not None, f"{key} (env={option}) is in no key table"
            if key in DERIVED or (option == "gym" and key == "env.id"):
                continue
            assert shown == key_reference.shown(value, ""), (key, shown, value)
    for key in leaf_keys():
        if key.startswith("model.") and key != "model.name":
            assert (None, key) in found, key


def test_help_prints_every_key_with_its_default_meaning_and_allowed_values():
    from dreamer import key_reference

    result = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    flat = " ".join(result.stdout.split())
    for title, _, keys in key_reference.sections():
        assert f"{title}:" in result.stdout
        for key in keys:
            assert f"{key.key}={key.default} {key.meaning} [{key.allowed}]" in flat, key.key


def test_the_minedojo_keys_defaults_are_what_env_minedojo_gets():
    text = section((DOC / "envs.md").read_text(), "## MineDojo")
    env = OmegaConf.to_container(load(["env=minedojo"]).env)
    documented = dict(re.findall(r"`env\.(\w+)`\s+\((\d+)", text))
    assert {"max_steps", "image_size", "launch_timeout"} <= set(documented)
    for key, value in documented.items():
        assert float(value) == env[key], (
            f"docs/envs.md: env.{key} ({value}), env=minedojo gets {env[key]}"
        )


def test_the_readme_is_a_skim_that_links_the_reference():
    """What it is, the two commands, what a run writes, the keys most people change and
    where the rest lives, in under 100 lines; every docs/ file linked from it."""
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == [
        "The two commands",
        "What a run writes",
        "The keys most people change",
        "Where the rest lives",
    ]
    assert len(text.splitlines()) < 100
    linked = set(re.findall(r"\]\((docs/[\w.]+\.md)\)", text))
    assert linked == {f"docs/{path.name}" for path in DOC.glob("*.md")}
    assert "make train" in text and "make test" in text
