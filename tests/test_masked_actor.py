"""The masked multi-head actor: never a masked choice, exact log-probabilities and entropy."""

import itertools
import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs import ExplorationType, set_exploration_type

from dreamer.agent.layout import Head
from dreamer.agent.masked import MaskedMultiHead, masked_multi_head_actor

# root: 0 noop, 1 move, 2 craft (uses head 1), 3 equip / 4 place (use head 2 with own masks)
HEADS = (
    Head(5, mask="mask_root"),
    Head(4, gated_by=((2, "mask_craft"),)),
    Head(6, gated_by=((3, "mask_equip"), (4, "mask_place"))),
)
SIZES = {"mask_root": 5, "mask_craft": 4, "mask_equip": 6, "mask_place": 6}


def random_masks(batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    masks = {k: torch.rand(batch, n, generator=generator) < 0.4 for k, n in SIZES.items()}
    masks["mask_root"][:, 0] = True  # noop is always valid, as in MineDojo
    masks["mask_root"][: batch // 10, 1:] = False  # all false but noop
    masks["mask_equip"][batch // 10 : batch // 5] = False  # equip valid, no item to equip
    return masks


def split(action: torch.Tensor) -> list[torch.Tensor]:
    return [part.argmax(-1) for part in action.split([h.size for h in HEADS], -1)]


def test_never_samples_a_masked_choice():
    generator = torch.Generator().manual_seed(0)
    masks = random_masks(10_000, generator)
    logits = torch.randn(10_000, 15, generator=generator) * 3
    dist = MaskedMultiHead(logits, HEADS, unimix=0.01, **masks)
    torch.manual_seed(0)
    for action in (dist.sample(), dist.deterministic_sample):
        root, craft, item = split(action)
        rows = torch.arange(10_000)
        assert masks["mask_root"][rows, root].all()
        used = root == 2
        assert masks["mask_craft"][rows[used], craft[used]].all()
        for choice, key in ((3, "mask_equip"), (4, "mask_place")):
            used = root == choice
            assert masks[key][rows[used], item[used]].all()
        # a root choice whose argument head has nothing valid is never taken
        assert not ((root == 3) & ~masks["mask_equip"].any(-1)).any()
        assert (root[:1000] == 0).all()
        # unused argument heads emit choice 0
        assert (craft[root != 2] == 0).all() and (item[(root != 3) & (root != 4)] == 0).all()
    assert dist.sample().sum(-1).eq(3).all()  # one one-hot per head


def joint_table(dist: MaskedMultiHead) -> dict[tuple[int, int, int], float]:
    """Every joint action's probability, by enumeration (one batch entry)."""
    root = dist.root.exp()[0]
    craft = dist.branches[1][0][1].exp()[0]
    items = {choice: lp.exp()[0] for choice, lp in dist.branches[2]}
    table = {}
    for r in range(5):
        if r == 2:
            args = [(c, 0, craft[c]) for c in range(4)]
        elif r in items:
            args = [(0, i, items[r][i]) for i in range(6)]
        else:
            args = [(0, 0, torch.tensor(1.0))]
        for c, i, p in args:
            table[(r, c, i)] = float(root[r] * p)
    return table


def test_log_prob_and_entropy_are_the_joint_distributions():
    generator = torch.Generator().manual_seed(1)
    masks = {k: v[5:6] for k, v in random_masks(20, generator).items()}
    masks["mask_root"][:] = True
    masks["mask_craft"][0, :2] = True
    masks["mask_equip"][0, 0] = True
    masks["mask_place"][0, 1] = True
    logits = torch.randn(1, 15, generator=generator)
    dist = MaskedMultiHead(logits, HEADS, unimix=0.05, **masks)
    table = joint_table(dist)
    assert sum(table.values()) == pytest.approx(1.0, abs=1e-5)
    entropy = -sum(p * math.log(p) for p in table.values() if p > 0)
    assert float(dist.entropy()[0]) == pytest.approx(entropy, rel=1e-5)
    for (r, c, i), p in table.items():
        action = torch.cat(
            [
                torch.nn.functional.one_hot(torch.tensor([x]), n)
                for x, n in zip((r, c, i), (5, 4, 6))
            ],
            -1,
        ).float()
        expected = math.log(p) if p > 0 else -math.inf
        assert float(dist.log_prob(action)[0]) == pytest.approx(expected, rel=1e-5)


def test_unimix_mixes_over_valid_choices_only():
    mask = torch.tensor([[True, False, True, False, False]])
    logits = torch.tensor([[50.0, 0.0, -50.0, 0.0, 0.0, *[0.0] * 10]])
    dist = MaskedMultiHead(logits, HEADS, unimix=0.01, mask_root=mask)
    root = dist.root.exp()[0]
    assert root[1] == 0 and root[3] == 0 and root[4] == 0
    assert float(root[2]) == pytest.approx(0.01 / 2, rel=1e-4)  # uniform over the 2 valid
    assert float(root.sum()) == pytest.approx(1.0, abs=1e-6)


def test_actor_samples_valid_actions_with_and_without_masks():
    torch.manual_seed(0)
    actor = masked_multi_head_actor(12, HEADS, depth=1, units=16, unimix=0.01)
    generator = torch.Generator().manual_seed(2)
    masks = random_masks(256, generator)
    data = TensorDict({"state": torch.randn(256, 8), "belief": torch.randn(256, 4), **masks}, [256])
    result = actor(data)
    root, craft, item = split(result["action"])
    assert masks["mask_root"][torch.arange(256), root].all()
    assert torch.isfinite(result["action_log_prob"]).all()
    # imagined states carry no masks: every choice is allowed, nothing fails
    imagined = TensorDict({"state": torch.randn(64, 8), "belief": torch.randn(64, 4)}, [64])
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        action = actor(imagined)["action"]
    assert action.shape == (64, 15) and action.sum(-1).eq(3).all()
    dist = actor.get_dist(imagined)
    assert torch.isfinite(dist.entropy()).all()
    assert set(actor.in_keys) == {"state", "belief", *SIZES}


def test_exploration_covers_every_valid_choice():
    masks = {k: torch.ones(4000, n, dtype=torch.bool) for k, n in SIZES.items()}
    dist = MaskedMultiHead(torch.zeros(4000, 15), HEADS, unimix=0.01, **masks)
    torch.manual_seed(3)
    root, craft, item = split(dist.sample())
    assert set(root.tolist()) == set(range(5))
    assert set(craft[root == 2].tolist()) == set(range(4))
    assert set(itertools.chain(item[root == 3].tolist(), item[root == 4].tolist())) == set(range(6))
