"""Tests for the configuration layer (dreamer/config.py + conf/)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from dreamer.command_line import load
from dreamer.config import CONF_DIR
from dreamer.errors import ConfigError
from dreamer.learning.learner import cpu_has_bf16
from dreamer.runtime.world import World
from dreamer.training.resume import resolved_logdir
from tests.runs import ROOT, forked_runs

SECTIONS = {"env", "model", "run", "replay", "collector", "learner", "eval", "logger"}
# deter, hidden, classes, cnn_depth, units: the DreamerV3 author's configs.yaml
AUTHOR_SIZES = {
    "size1m": (512, 64, 4, 4, 64),
    "size12m": (2048, 256, 16, 16, 256),
    "size25m": (3072, 384, 24, 24, 384),
    "size50m": (4096, 512, 32, 32, 512),
    "size100m": (6144, 768, 48, 48, 768),
    "size200m": (8192, 1024, 64, 64, 1024),
    "size400m": (12288, 1536, 96, 96, 1536),
}


def dims(cfg):
    m = cfg.model
    return (m.deter, m.hidden, m.classes, m.cnn_depth, m.units)


def test_defaults_follow_the_dreamerv3_recipe():
    """The author's recipe (shared/CONTEXT.md): size12m, 16 x 64 batches, train ratio
    512 on Crafter, horizon 15, 255 bins, LaProp lr 4e-5, slow critic 0.02."""
    cfg = load([])
    assert set(cfg) == SECTIONS
    assert cfg.env.name == "crafter" and cfg.model.name == "size12m"
    assert dims(cfg) == AUTHOR_SIZES["size12m"]
    assert (cfg.model.stoch, cfg.model.blocks, cfg.model.bins) == (32, 8, 255)
    assert (cfg.replay.batch, cfg.replay.length, cfg.run.train_ratio) == (16, 64, 512)
    assert cfg.learner.lr == 4e-5 and cfg.learner.horizon == 15
    assert cfg.learner.slow_critic_rate == 0.02
    # agent.loss_scales, dyn.rssm.free_nats, imag_loss.slowreg and imag_last
    official = {"rec": 1, "rew": 1, "con": 1, "dyn": 1, "rep": 0.1, "policy": 1, "value": 1}
    assert cfg.learner.loss_scales == {**official, "repval": 0.3}
    assert (cfg.learner.free_nats, cfg.learner.slowreg, cfg.learner.imag_last) == (1, 1, 0)


def test_imag_last_1_is_allowed_without_the_replay_value_term():
    cfg = load(["learner.imag_last=1", "learner.loss_scales.repval=0"])
    assert cfg.learner.imag_last == 1
    with pytest.raises(ConfigError) as info:
        load(["learner.imag_last=1"])
    assert "learner.imag_last" in str(info.value)


def test_a_preset_setting_a_removed_key_gets_one_line_naming_what_replaced_it(
    tmp_path, monkeypatch
):
    from dreamer import command_line, config

    conf = shutil.copytree(CONF_DIR, tmp_path / "conf")
    (conf / "experiment" / "old.yaml").write_text(  # an experiment of an earlier version
        "# @package _global_\nlearner:\n  rollout: fused\n"
    )
    for module in (config, command_line):
        monkeypatch.setattr(module, "CONF_DIR", conf)
    with pytest.raises(ConfigError, match=r"^learner.rollout: removed: .*learner.compile"):
        load(["experiment=old"])


def test_a_renamed_key_works_by_its_old_name_with_one_line_naming_the_new():
    """learner.slow_critic (an EMA rate beside slowreg, a weight) is slow_critic_rate: the
    old name on a command line is read as the new one, with a note; a run directory
    saved under the old name resumes, and a changed value is still refused."""
    from dreamer.training.resume import check_resume

    shown = subprocess.run(
        [sys.executable, "-m", "dreamer.train", "--cfg", "job", "learner.slow_critic=0.05"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["learner"]["slow_critic_rate"] == 0.05
    assert shown.stderr.strip() == (
        "note: learner.slow_critic is now learner.slow_critic_rate; read as that"
    )
    cfg = load([])
    old = OmegaConf.to_container(cfg)
    old["learner"]["slow_critic"] = old["learner"].pop("slow_critic_rate")
    check_resume(old, cfg)  # the same run: resumes
    old["learner"]["slow_critic"] = 0.05
    with pytest.raises(ConfigError, match=r"^learner.slow_critic_rate: cannot change"):
        check_resume(old, cfg)


def test_result_is_read_only_and_struct():
    cfg = load([])
    with pytest.raises(Exception, match="read-only"):
        cfg.run.steps = 5
    with pytest.raises(Exception, match="bogus"):
        _ = cfg.run.bogus


@pytest.mark.parametrize("name", sorted(AUTHOR_SIZES))
def test_model_presets_are_the_authors_sizes(name):
    cfg = load([f"model={name}"])
    assert cfg.model.name == name and dims(cfg) == AUTHOR_SIZES[name]
    assert cfg.model.deter % cfg.model.blocks == 0 and cfg.model.hidden % cfg.model.blocks == 0


def preset_values(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if key != "defaults":
            if isinstance(value, dict):
                yield from preset_values(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value


PRESETS = sorted(
    (group, path.stem)
    for group in ("model", "experiment")
    for path in (CONF_DIR / group).glob("*.yaml")
)


@pytest.mark.parametrize(("group", "name"), PRESETS, ids=[f"{g}={n}" for g, n in PRESETS])
def test_every_value_a_preset_sets_reaches_the_loaded_config(group, name):
    """Each key a preset file sets beats the schema's default and the base config's
    (a model preset sits at model.*, an experiment at the root)."""
    preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    cfg = load([f"{group}={name}"])
    prefix = "model." if group == "model" else ""
    values = dict(preset_values(preset, prefix))
    assert values
    for key, value in values.items():
        assert OmegaConf.select(cfg, key) == value, key


@pytest.mark.parametrize("order", [0, 1])
def test_smoke_with_explicit_groups(order):
    overrides = ["experiment=smoke", "env=cartpole", "model=size1m"]
    cfg = load(overrides if order == 0 else overrides[::-1])
    assert cfg.env.name == "cartpole" and cfg.env.id == "CartPole-v1" and cfg.env.length == 500
    assert cfg.model.name == "size1m"  # the user's group choice beats the experiment's
    assert cfg.run.steps == 2000


def test_gym_env_with_registered_id():
    cfg = load(["env=gym", "env.id=Acrobot-v1"])
    assert (cfg.env.name, cfg.env.id, cfg.env.length) == ("gym", "Acrobot-v1", 0)


def test_derived_logdir(tmp_path, monkeypatch):
    """Loading a config reads no run directory: run.logdir stays unset until the run
    resolves it (a new timestamped folder of the env's)."""
    monkeypatch.chdir(tmp_path)  # no runs/ here: nothing to resume
    cfg = load(["env=cartpole", "run.resume=latest"])  # looked, it raised here
    assert cfg.run.logdir is None
    with pytest.raises(ConfigError, match="nothing to resume under runs/cartpole/: no run"):
        resolved_logdir(cfg)
    assert re.fullmatch(r"runs/cartpole/\d{8}-\d{6}", str(resolved_logdir(load(["env=cartpole"]))))
    assert resolved_logdir(load(["run.logdir=/tmp/somewhere"])) == Path("/tmp/somewhere")


def test_a_gym_runs_folder_names_its_env_and_resume_reads_the_old_layout(tmp_path, monkeypatch):
    """env=gym writes to runs/gym/<env.id>/ (all of them went to runs/gym/); resume=latest
    finds this id's unfinished runs there and in the old runs/gym/<ts>/ (by config.yaml),
    never another id's."""
    monkeypatch.chdir(tmp_path)
    logdir = resolved_logdir(load(["env=gym", "env.id=tests.faulty_env:Faulty-v0"]))
    assert re.fullmatch(r"runs/gym/tests\.faulty_env_Faulty-v0/\d{8}-\d{6}", str(logdir))

    def run(folder: str, env_id: str, step: int) -> Path:
        path = tmp_path / "runs" / "gym" / folder
        (path / "checkpoints").mkdir(parents=True)
        (path / "checkpoints" / f"checkpoint-{step:012d}.pt").write_bytes(b"")
        OmegaConf.save({"env": {"name": "gym", "id": env_id}}, path / "config.yaml")
        return path

    resume = ["env=gym", "env.id=Pendulum-v1", "run.resume=latest", "run.steps=1000"]
    old = run("20260101-000000", "Pendulum-v1", 100)
    run("20260102-000000", "Acrobot-v1", 100)  # newer, another id's
    assert resolved_logdir(load(resume)).resolve() == old.resolve()
    new = run("Pendulum-v1/20260103-000000", "Pendulum-v1", 200)
    assert resolved_logdir(load(resume)).resolve() == new.resolve()
    acrobot = load(["env=gym", "env.id=Acrobot-v1", "run.resume=latest", "run.steps=100"])
    with pytest.raises(
        ConfigError, match="nothing to resume under runs/gym/Acrobot-v1/: its run is"
    ):
        resolved_logdir(acrobot)


def test_a_resume_takes_its_runs_config_and_only_what_the_command_sets(tmp_path, monkeypatch):
    """``run.resume=latest`` finds a smoke run by its own run.steps and continues it with
    its config: the keys the command line sets go on top; in a torchrun job of a world
    size the defaults do not divide (3: 16 envs), the defaults it compares with are not
    refused."""
    from dreamer.command_line import validated
    from dreamer.training.resume import resumed

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "3")
    folder = Path("runs/crafter/20260101-000000")
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-000000000500.pt").write_bytes(b"")
    smoke = ["experiment=smoke", "run.envs=3", "replay.batch=3"]
    OmegaConf.save(load(smoke), folder / "config.yaml")
    command = ["run.resume=latest", "run.log_every=7"]
    with pytest.raises(ConfigError, match="run.envs: split evenly across the 3 ranks"):
        load(command)  # the defaults alone: 16 envs
    cfg = validated(resumed(load(command, check=False), command))  # as dreamer.train does
    assert (cfg.run.logdir, cfg.run.steps, cfg.run.envs) == (str(folder), 2000, 3)
    assert (cfg.collector.chunk, cfg.model.name, cfg.run.log_every) == (16, "tiny", 7)


def test_minedojo_preset(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "standins"))  # an importable minedojo
    env = OmegaConf.to_container(load(["env=minedojo"]).env)
    assert env["image_size"] == 64 and env["sticky_attack"] == 30 and env["pitch_limit"] == 60
    assert env["break_speed"] == 100 and env["sticky_jump"] == 10 and env["max_steps"] == 3000


def test_load_raises_config_error():
    with pytest.raises(ConfigError) as info:
        load(["run.steps=-5"])
    assert str(info.value) == "run.steps: must be >= 1, got -5"


def test_cuda_requested_without_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^learner\.device: cuda requested.*allowed: auto, cpu$"):
        World().device(load(["learner.device=cuda"]).learner.device)


BAD = [
    (["run.steps=-5"], "run.steps"),
    (["run.train_ratio=0"], "run.train_ratio"),
    (["run.train_ratio=-1"], "run.train_ratio"),
    (["replay.batch=0"], "replay.batch"),
    (["collector.chunk=0"], "collector.chunk"),
    (["run.steps=abc"], "run.steps"),
    (["run.progress=maybe"], "run.progress"),
    (["run.bogus=1"], "run.bogus"),
    (["+run.bogus=1"], "run.bogus"),
    (["bogus=1"], "bogus"),
    (["env=nope"], "env"),
    (["model=huge"], "model"),
    (["experiment=nope"], "experiment"),
    (["env=gym", "env.id=Nope-v0"], "env.id"),
    (["env=gym"], "env.id"),
    (["env.name=foo"], "env.name"),
    (["env.name=dmc"], "env.name"),  # a kind is chosen by env=, whose schema types env
    (["learner.device=tpu"], "learner.device"),
    (["learner.lmbda=1.5"], "learner.lmbda"),
    (["model.unimix=1"], "model.unimix"),
    (["replay.length=1"], "replay.length"),
    (["replay.size=100"], "replay.size"),
    (["model.blocks=3"], "model.blocks"),
    (["run.steps"], "run.steps"),
    (["run.steps=1,2"], "run.steps"),
    (["--cfg", "hydra"], "--cfg"),
    (["env.pitch_limit=120"], "env.pitch_limit"),
    (["env.sticky_attack=-1"], "env.sticky_attack"),
    (["env.fast_reset=sometimes"], "env.fast_reset"),
    (["env=minedojo"], "env"),  # the minedojo package is not installed here
    (["collector.sync_every=0"], "collector.sync_every"),
    (["collector.push_timeout=0"], "collector.push_timeout"),
    (["collector.threads=0"], "collector.threads"),
    (["collector.envs_per_worker=0"], "collector.envs_per_worker"),
    (["collector.envs_per_worker=3"], "collector.envs_per_worker"),  # must divide run.envs=4
    (["collector.worker_affinity=all"], "collector.worker_affinity"),
    (["collector.inference.max_batch=-1"], "collector.inference.max_batch"),
    (["collector.inference.min_batch=0"], "collector.inference.min_batch"),
    (["collector.inference.min_batch=5"], "collector.inference.min_batch"),  # > 4 envs
    (["collector.inference.timeout=-0.1"], "collector.inference.timeout"),
    *(  # CUDA graphs and bf16 autocast need a GPU
        []
        if torch.cuda.is_available()
        else [
            (["collector.inference.static_batch=true"], "collector.inference.static_batch"),
            (["learner.cudagraph=true"], "learner.cudagraph"),
        ]
    ),
    # bf16 on a CPU needs its bf16 instructions
    *(
        []
        if torch.cuda.is_available() or cpu_has_bf16()
        else [(["learner.precision=bf16"], "learner.precision")]
    ),
    (["learner.device=cpu", "learner.cudagraph=true"], "learner.cudagraph"),
    (["learner.compile=maybe"], "learner.compile"),
    (["learner.precision=fp8"], "learner.precision"),
    (["learner.rollout=fused"], "learner.rollout"),  # removed: one update everywhere
    (["run.resume=latest", "run.logdir=no_such_run"], "run.resume=latest: no_such_run holds"),
    (["run.resume=latest", "run.logdir=."], "run.resume=latest: . holds no checkpoint"),
    (["learner.loss_scales.dyn=-1"], "learner.loss_scales.dyn"),
    (["learner.loss_scales.nope=1"], "learner.loss_scales.nope"),
    (["learner.free_nats=-0.5"], "learner.free_nats"),
    (["learner.slowreg=-1"], "learner.slowreg"),
    (["learner.repval=0.3"], "learner.repval"),  # now learner.loss_scales.repval
    (["learner.imag_starts=32"], "learner.imag_starts"),  # now learner.imag_last
    (["learner.imag_last=65"], "replay.length"),  # more steps than a sequence has
    (["learner.imag_last=1"], "learner.loss_scales.repval"),  # no replay-value step left
    (["collector.inference.static_batch=maybe"], "collector.inference.static_batch"),
    (["collector.inference.nope=1"], "collector.inference.nope"),
    (["run.gc_freeze=sometimes"], "run.gc_freeze"),
    (["eval.every=-1"], "eval.every"),
    (["eval.episodes=0"], "eval.episodes"),
    (["eval.envs=0"], "eval.envs"),
    (["eval.render_workers=-2"], "eval.render_workers"),
    (["eval.render_workers=many"], "eval.render_workers"),
    (["eval.timeout=0"], "eval.timeout"),
    (["logger=[jsonl,nope]"], "logger"),
    (["logger=[tensorboard]"], "logger"),  # metrics.jsonl is always written
    (["logger.mlflow.nope=1"], "logger.mlflow.nope"),
    (["logger.wandb.mode=cloud"], "logger.wandb.mode"),
    (["run.from_checkpoint=/no/such/run"], "run.from_checkpoint"),
    (["run.from_checkpoint_parts=[brain]"], "run.from_checkpoint_parts"),
    (["run.from_checkpoint_parts=[optimizer]"], "run.from_checkpoint_parts"),
    (["env=dmc", "env.task=cartpole_nope"], "env.task"),
    (["env=dmc", "env.obs=pixels"], "env.obs"),
    (["env=atari", "env.game=pongg"], "env.game"),
    (["env=atari", "env.lives=discount"], "env.lives"),
    (["env=gym", "env.id=CartPole-v1", "env.kwargs=3"], "env.kwargs"),
]


CFG_FLAGS = [["--cfg", "job"], ["--cfg=job"], ["-c", "job"]]
EXTRAS = [("dmc", "dm_control"), ("atari", "ale_py")]
TRACKERS = ["wandb", "mlflow"]
GOOD = [
    *(([*flag, "experiment=smoke", "env=cartpole"], []) for flag in CFG_FLAGS),
    *(([f"env={env}"], [package]) for env, package in EXTRAS),
    (["env=minedojo"], []),  # not installed here: its stand-in is on no path
    *(([f"logger=[jsonl,{tracker}]"], [tracker]) for tracker in TRACKERS),
    (["--help"], []),
]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """Every BAD and GOOD command line as a real process of its own, forked from the
    zygote one after another (120 fresh interpreters cost minutes on 2 cores): (the
    directory it ran in, {(arguments, hidden): (stdout, stderr, exit code)})."""
    cwd, out = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("out")
    rows = [(o, []) for o, _ in BAD] + GOOD
    done = forked_runs("dreamer.train", rows, out, cwd=cwd)
    results = {
        (tuple(argv), tuple(hidden)): (run.stdout, run.stderr, run.returncode)
        for (argv, hidden), run in zip(rows, done)
    }
    return cwd, results


def cli(runs, *argv: str, hidden: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    stdout, stderr, code = runs[1][argv, hidden]
    return subprocess.CompletedProcess(argv, code, stdout, stderr)


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_override_exits_2_with_one_line(overrides, key, cli_runs):
    cwd, results = cli_runs
    _, stderr, returncode = results[tuple(overrides), ()]
    assert returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert key in lines[0]
    assert not (cwd / "runs").exists()  # validation creates nothing


@pytest.mark.parametrize(("env", "package"), EXTRAS)
def test_missing_extra_exits_2_with_the_pip_command(env, package, cli_runs):
    result = cli(cli_runs, f"env={env}", hidden=(package,))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: env: {env} needs {package}; install it with "
        f"{sys.executable} -m pip install -e '.[{env}]'"
    ]
    # the interpreter it names has its pip, also from a shell without the venv on PATH
    printed = shlex.split(result.stderr.split("install it with ", 1)[1])
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    pip = subprocess.run([*printed[:3], "--version"], env=bare, capture_output=True, text=True)
    assert pip.returncode == 0 and pip.stdout.startswith("pip "), pip.stderr


def test_minedojo_missing_points_at_the_page_with_what_pip_cannot_install(cli_runs):
    """MineDojo needs more than its extra; the one line names the page that says what."""
    result = cli(cli_runs, "env=minedojo")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: env: minedojo needs minedojo; install it with ")
    page, heading = re.search(r'JDK 8 and xvfb: (\S+), "(\w+)"\)$', line).groups()
    text = (ROOT / page).read_text()
    assert f"## {heading}" in text
    minedojo = text.split(f"## {heading}", 1)[1]
    assert all(need in minedojo for need in ("gym==0.21", "numpy<2", "JDK 8", "xvfb"))


def test_gym_kwargs_reach_the_config_whole():
    cfg = load(
        [
            "env=gym",
            "env.id=CartPole-v1",
            "env.kwargs={max_episode_steps: 7, sutton_barto_reward: true}",
        ]
    )
    assert dict(cfg.env.kwargs) == {"max_episode_steps": 7, "sutton_barto_reward": True}


@pytest.mark.parametrize("flag", CFG_FLAGS, ids=" ".join)
def test_cfg_job_prints_yaml(flag, cli_runs):
    proc = cli(cli_runs, *flag, "experiment=smoke", "env=cartpole")
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["run"].pop("logdir").startswith("runs/cartpole/")
    loaded = OmegaConf.to_container(load(["experiment=smoke", "env=cartpole"]))
    del loaded["run"]["logdir"]
    assert printed == loaded  # what the command line runs is what load() gives


@pytest.mark.parametrize("tracker", TRACKERS)
def test_a_tracker_whose_extra_is_missing_exits_2_naming_the_extra(tracker, cli_runs):
    proc = cli(cli_runs, f"logger=[jsonl,{tracker}]", hidden=(tracker,))
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: logger: {tracker} is not installed; install it with "
        f"{sys.executable} -m pip install -e '.[{tracker}]'"
    )


def test_help(cli_runs):
    proc = cli(cli_runs, "--help")
    assert proc.returncode == 0
    assert "atari | cartpole | crafter | cue | dmc | gym" in proc.stdout
    assert "size12m" in proc.stdout
    assert "smoke" in proc.stdout and "train_ratio" in proc.stdout
    # a field made by a factory shows its value, not the dataclass sentinel
    assert "run.from_checkpoint_parts=[world_model,actor,critic]" in proc.stdout
    assert "object at 0x" not in proc.stdout


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("eval.episodes=0", "eval.episodes: must be >= 1, got 0"),
        ("eval.episodes=two", "eval.episodes: expected an integer, got 'two'"),
        ("eval.nope=1", "eval.nope: not a key of this command; allowed: run.logdir, eval."),
        ("run.steps=5", "run.steps: not a key of this command; allowed: run.logdir, eval.episodes"),
        ("eval.episodes=2", "run.logdir: required"),
    ],
)
def test_evaluate_rejects_bad_arguments_with_one_line(argument, message, capsys):
    from dreamer.evaluate import main as evaluate_main

    assert evaluate_main([argument]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1


def test_the_cpu_speed_note_counts_train_starts_and_names_a_run_that_fits():
    from dreamer.runtime.timing import CpuSpeedNote

    smoke, long = load(["experiment=smoke"]), load(["experiment=dmc_proprio"])
    short = CpuSpeedNote(smoke, True).note(0.05, "timed")
    assert "make smoke" not in short and "experiment=dmc_proprio_cpu" not in short
    run, replay = smoke.run, smoke.replay
    updates = (run.steps - run.train_starts) * run.train_ratio / (replay.batch * replay.length)
    assert f"~{updates:,.0f} more updates" in short  # none before train_starts
    assert f"= ~{updates * 0.05:.0f} s of learner time" in short  # not "~0.0 h"
    assert "= ~12 min of" in CpuSpeedNote(smoke, True).note(720 / updates, "timed")
    resumed = CpuSpeedNote(smoke, True, env_steps=run.steps - 100).updates()
    assert resumed == 100 * run.train_ratio / (replay.batch * replay.length)
    note = CpuSpeedNote(long, True).note(0.5, "timed")
    assert "make smoke" in note and "make train ARGS=experiment=dmc_proprio_cpu" in note
    run, replay = long.run, long.replay
    updates = (run.steps - run.train_starts) * run.train_ratio / (replay.batch * replay.length)
    assert f"~{updates:,.0f} more updates = ~{updates * 0.5 / 3600:,.1f} h" in note
