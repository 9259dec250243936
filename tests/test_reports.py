"""Open-loop predictions: after the context they depend on actions, never on observations."""

import json

import numpy as np
import torch

from dreamer.agent.build import build_agent
from dreamer.command_line import load
from dreamer.evaluation.reports import open_loop
from tests.batches import real_batch


def test_open_loop_ignores_observations_after_the_context():
    cfg = load(["experiment=smoke"])  # Crafter images
    spaces, batch = real_batch(cfg, 2, 10)
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    torch.manual_seed(1)  # the same latent draws in every call below
    truth, model = open_loop(agent, batch, context=4, image="pixels")
    assert truth.shape == model.shape == (2, 10, 64, 64, 3) and model.dtype == np.uint8
    assert (truth == batch["next", "pixels"].numpy()).all()
    changed = batch.clone()
    changed["next", "pixels"][:, 4:] = 255 - changed["next", "pixels"][:, 4:]
    torch.manual_seed(1)
    _, model_changed = open_loop(agent, changed, context=4, image="pixels")
    assert (model_changed[:, 4:] == model[:, 4:]).all(), "imagined frames saw observations"
    changed["next", "pixels"][:, :4] = 0  # the context does matter
    torch.manual_seed(1)
    _, model_context = open_loop(agent, changed, context=4, image="pixels")
    assert (model_context[:, :4] != model[:, :4]).any()
    assert (model_context[:, 4:] != model[:, 4:]).any()


def test_crafter_score_is_the_geometric_mean_of_one_plus_rates():
    from dreamer.evaluation.reports import crafter_score

    assert crafter_score([0.0] * 22) == 0.0
    assert abs(crafter_score([100.0] * 22) - 100.0) < 1e-9
    # one achievement always, the rest never: (101 ** (1 / 22)) - 1
    assert abs(crafter_score([100.0] + [0.0] * 21) - (101 ** (1 / 22) - 1)) < 1e-9
    assert crafter_score([50.0, 0.0]) < 25.0  # below the arithmetic mean


def test_the_learning_curves_read_a_metrics_file_a_crash_cut_short(tmp_path):
    """A run killed mid-write leaves half a line last in metrics.jsonl; the curves of an
    evaluation of that run (``python -m dreamer.evaluate``) come from the whole rows
    (the half line raised JSONDecodeError)."""
    from dreamer.evaluation.reports import learning_curves

    rows = [
        {"env_steps": 100, "episode/return": 1.5, "episode/count": 2},
        {"env_steps": 200, "eval/return": 3.0, "eval/episodes": 4},
        {"env_steps": 300, "episode/return": 2.5, "episode/count": 3},
    ]
    whole = "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "metrics.jsonl").write_text(whole + json.dumps(rows[0])[:17])
    curves, labels = learning_curves(tmp_path / "metrics.jsonl")
    assert curves == {"train": ([100, 300], [1.5, 2.5]), "eval": ([200], [3.0])}
    assert labels["train"].startswith("train: 5 episodes")
