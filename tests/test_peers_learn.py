"""benchmarks/peers/learn.py and the protocol it trains at (experiment=dmc_proprio_cpu):
bad input exits 2 with one line; the preset trains end to end for a tiny budget; the
harness records that run's training returns, its return at the budget and its plot; the
official's command is derived from the same preset."""

import importlib.util
import json

import pytest

from dreamer.command_line import load
from dreamer.runtime import checkpoint
from tests.runs import ROOT, read_metrics, run_trainer

spec = importlib.util.spec_from_file_location("learn", ROOT / "benchmarks" / "peers" / "learn.py")
learn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learn)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--task", "cartpole_swing"], "--task"),
        (["--task", "cartpole_balance", "--impls", "ours", "dreamerv4"], "--impls"),
        (["--task", "cartpole_balance", "--impls", "official"], "make peers OFFICIAL_SRC="),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, named, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(learn, "PEERS", tmp_path / "no-peers")  # the official not built
    code = learn.main([*argv, "--runs", str(tmp_path / "runs"), "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert not list(tmp_path.iterdir()), "bad input left files"


def test_the_official_command_follows_the_preset(tmp_path, monkeypatch):
    source = tmp_path / "dreamerv3-src"
    venv = tmp_path / "peers" / "official"
    venv.mkdir(parents=True)
    (venv / ".installed").touch()
    (venv / "OFFICIAL_SRC").write_text(f"{source}\n")
    monkeypatch.setattr(learn, "PEERS", tmp_path / "peers")
    command, env = learn.commands("official", "reacher_easy", 2, 3000, tmp_path / "run")
    flags = dict(zip(command[4::2], command[5::2]))
    cfg = load([learn.PRESET])
    assert command[2:4] == ["--configs", "dmc_proprio"]  # size1m, proprio only
    assert flags["--task"] == "dmc_reacher_easy" and flags["--seed"] == "2"
    assert flags["--run.steps"] == "3000"
    assert float(flags["--run.train_ratio"]) == cfg.run.train_ratio
    assert int(flags["--run.envs"]) == cfg.run.envs
    assert (int(flags["--batch_size"]), int(flags["--batch_length"])) == (
        cfg.replay.batch,
        cfg.replay.length,
    )
    assert int(flags["--env.dmc.repeat"]) == cfg.env.repeat == 1
    assert flags["--jax.compute_dtype"] == "float32"
    assert env["PYTHONPATH"] == str(source)


def test_the_cpu_preset_is_the_official_one_but_for_ratio_budget_and_replay_size():
    official, cpu = load(["experiment=dmc_proprio"]), load(["experiment=dmc_proprio_cpu"])
    changed = {
        f"{section}.{key}"
        for section in ("run", "replay", "learner", "model", "env", "collector")
        for key, value in official[section].items()
        if cpu[section][key] != value and key != "logdir"
    }
    assert changed == {"run.train_ratio", "run.steps", "replay.size"}
    updates = cpu.run.steps * cpu.run.train_ratio / (cpu.replay.batch * cpu.replay.length)
    assert 2_000 <= updates <= 4_000, updates  # ~3,100 updates: the preset's budget
    assert cpu.replay.size >= cpu.run.steps  # nothing evicted, as with the official's 5e6


def test_the_wall_ratio_compares_runs_on_the_same_cpu_only():
    def record(impl, seed, wall, cpu=None):
        run = {"impl": impl, "seed": seed, "steps": 50, "wall_s": wall, "return_at_budget": 1.0}
        return run | ({"cpu": cpu} if cpu else {})

    runs = [
        record("ours", 0, 100.0, "fast"),
        record("ours", 1, 140.0, "fast"),
        record("official", 0, 240.0, "fast"),
        record("ours", 2, 300.0, "slow"),  # no official run on this CPU: no ratio
        record("ours", 3, 90.0),
        record("official", 1, 100.0),  # recorded before the CPU was
        record("official", 2, 999.0, "fast") | {"steps": 60},  # another budget
    ]
    ratios = learn.summary({f"run{i}": r for i, r in enumerate(runs)}, 50)["ours_vs_official"]
    assert ratios["wall_ratio_by_cpu"] == {"fast": 0.5, "unrecorded": 0.9}


@pytest.mark.slow
def test_the_preset_trains_end_to_end_and_the_harness_records_it(tmp_path):
    task, steps = "cartpole_balance", 1280
    logdir = tmp_path / "runs" / task / "ours-seed0"
    tiny = [f"run.steps={steps}", "run.train_starts=1024", "run.log_every=128"]
    tiny += ["env.length=100", "eval.every=640", "eval.episodes=1", "eval.max_steps=100"]
    tiny += ["learner.compile=false"]  # the suite never compiles (minutes per shape)
    result = run_trainer(logdir, "experiment=dmc_proprio_cpu", f"env.task={task}", *tiny)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(logdir)
    # train ratio 64 at 16 x 64: one update per 16 env steps once training starts
    assert rows[-1]["env_steps"] == steps
    assert abs(rows[-1]["updates"] - (steps - 1024) / 16) <= 2, rows[-1]["updates"]
    weights = checkpoint.load(checkpoint.latest(logdir))["learner"]["loss"]
    assert any(512 in w.shape for w in weights.values())  # size1m's deter

    code = learn.main(
        ["--task", task, "--impls", "ours", "--steps", str(steps), "--reuse"]
        + ["--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    )
    assert code == 0
    recorded = json.loads((tmp_path / "results" / f"peers_learn_{task}.json").read_text())
    run = recorded["runs"]["ours-seed0"]
    episodes = [r for r in rows if "episode/return" in r]
    assert run["training_returns"] == [
        [r["env_steps"], r["episode/return"], r["episode/count"]] for r in episodes
    ]
    late = [r for r in episodes if r["env_steps"] > steps * (1 - learn.AT_BUDGET)]
    expected = sum(r["episode/return"] * r["episode/count"] for r in late)
    expected /= sum(r["episode/count"] for r in late)
    assert run["return_at_budget"] == pytest.approx(expected)
    assert [step for step, _ in run["eval_returns"]] == [
        r["env_steps"] for r in read_metrics(logdir, "eval")
    ] and run["eval_returns"]
    assert recorded["summary"]["ours"]["seeds"] == [0]
    assert (tmp_path / "results" / f"peers_learn_{task}.png").stat().st_size > 10_000
