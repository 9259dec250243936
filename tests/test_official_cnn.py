"""The DreamerV3 author's default image CNNs (``model.cnn_strided=false``, dreamer/agent/
cnn.py): shapes, gradients, the per-stage structure and its FLOPs against torchrl's
strided CNNs, and a learner update, acting and the policy rebuild with them."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torchrl.modules import DreamerV3ImageDecoder, DreamerV3ImageEncoder

from dreamer.agent.build import build_acting, build_agent, latent_sizes
from dreamer.agent.cnn import PoolingImageEncoder, UpsamplingImageDecoder
from dreamer.agent.networks import CNN_MULTS, MultiDecoder, MultiEncoder
from dreamer.agent.spaces import EnvSpaces, ObsKey
from dreamer.command_line import load
from dreamer.envs.make import make_env
from dreamer.learning.learner import Learner
from dreamer.serving.policy import acting_weights
from tests.batches import real_batch
from tests.compare import RTOL, losses_and_gradients, relative_error
from tests.torchrl_reference import TorchrlReference

KERNEL = 5
STATE, BELIEF, UNITS = 2 * 8, 64, 32  # a small latent: stoch x classes, deter, MLP width


def image_spaces(height: int, width: int, channels: int) -> EnvSpaces:
    return EnvSpaces((ObsKey("image", (height, width, channels), "image"),), 3, True)


def networks(shape, depth):
    spaces = image_spaces(*shape)
    encoder = MultiEncoder(spaces, depth, UNITS, 1, strided=False)
    decoder = MultiDecoder(
        spaces, STATE + BELIEF, depth, UNITS, 1, strided=False, state_features=STATE
    )
    return encoder, decoder


@pytest.mark.parametrize("shape", [(64, 64, 3), (32, 32, 1), (48, 80, 3)])
@pytest.mark.parametrize("depth", [4, 16])
def test_shapes_for_images_whose_sides_are_multiples_of_16(shape, depth):
    height, width, channels = shape
    encoder, decoder = networks(shape, depth)
    assert all(isinstance(cnn, PoolingImageEncoder) for cnn in encoder.cnns)
    assert all(isinstance(cnn, UpsamplingImageDecoder) for cnn in decoder.cnns)
    # four halvings; the last stage has depth * 4 channels
    assert encoder.out_features == depth * CNN_MULTS[-1] * (height // 16) * (width // 16)
    images = torch.randint(0, 256, (2, 3, *shape), dtype=torch.uint8)
    embedding = encoder(images)
    assert embedding.shape == (2, 3, encoder.out_features)
    (reconstruction,) = decoder(torch.randn(2, 3, STATE), torch.randn(2, 3, BELIEF))
    assert reconstruction.shape == (2, 3, *shape)  # HWC, like the observation
    assert reconstruction.dtype == torch.float32
    # the author's sigmoid: the scale of target / 255, as the loss compares it
    assert ((reconstruction > 0) & (reconstruction < 1)).all()


def test_a_reconstruction_loss_reaches_every_parameter():
    torch.manual_seed(0)
    encoder, decoder = networks((32, 32, 3), 4)
    images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8)
    # fixed projections of the embedding stand in for the RSSM, so the gradient reaches
    # the encoder through the decoder
    to_state = torch.randn(encoder.out_features, STATE) / encoder.out_features**0.5
    to_belief = torch.randn(encoder.out_features, BELIEF) / encoder.out_features**0.5
    embedding = encoder(images)
    (reconstruction,) = decoder(embedding @ to_state, embedding @ to_belief)
    loss = (reconstruction - images.float() / 255).pow(2).sum((-3, -2, -1)).mean()
    loss.backward()
    named = [*encoder.named_parameters(), *decoder.named_parameters()]
    # encoder: 4 x (conv weight, bias, norm); decoder: belief projection (2), state MLP
    # (5), projection norm, 4 x (conv weight, bias), 3 norms
    assert len(named) == 4 * 3 + (2 + 5 + 1 + 4 * 2 + 3)
    for name, parameter in named:
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
        assert parameter.grad.abs().sum() > 0, name


def test_stages_are_stride_one_convolutions_with_pooling_and_upsampling():
    depth, shape = 4, (3, 64, 64)
    encoder = PoolingImageEncoder(3, depth, CNN_MULTS)
    decoder = UpsamplingImageDecoder(STATE, BELIEF, shape, depth, CNN_MULTS, units=UNITS)
    for cnn in (encoder, decoder):
        convs = [m for m in cnn.modules() if isinstance(m, nn.Conv2d)]
        assert len(convs) == len(CNN_MULTS)
        for conv in convs:
            assert conv.kernel_size == (KERNEL, KERNEL) and conv.stride == (1, 1)
            assert conv.padding == (KERNEL // 2, KERNEL // 2)  # "same": keeps H x W
    channels = [depth * mult for mult in CNN_MULTS]
    assert [m.out_channels for m in encoder.layers if isinstance(m, nn.Conv2d)] == channels
    decoded = [m.out_channels for m in decoder.layers if isinstance(m, nn.Conv2d)]
    assert decoded == [*channels[::-1][1:], 3]
    # record every layer's output resolution on a real forward pass
    sizes = []
    hooks = [
        m.register_forward_hook(lambda m, i, o: sizes.append((type(m), i[0].shape, o.shape)))
        for cnn in (encoder, decoder)
        for m in cnn.layers
        if isinstance(m, (nn.Conv2d, nn.MaxPool2d, nn.Upsample))
    ]
    encoder(torch.randint(0, 256, (2, *shape), dtype=torch.uint8))
    decoder(torch.randn(2, STATE), torch.randn(2, BELIEF))
    for hook in hooks:
        hook.remove()
    kinds = [kind for kind, _, _ in sizes]
    # encoder: conv then pool per stage; decoder: upsample then conv per stage
    assert kinds == [nn.Conv2d, nn.MaxPool2d] * 4 + [nn.Upsample, nn.Conv2d] * 4
    for kind, before, after in sizes:
        factor = {nn.Conv2d: 1.0, nn.MaxPool2d: 0.5, nn.Upsample: 2.0}[kind]
        assert after[-2:] == tuple(int(side * factor) for side in before[-2:]), kind
    assert [after[-1] for kind, _, after in sizes if kind is nn.MaxPool2d] == [32, 16, 8, 4]
    assert [after[-1] for kind, _, after in sizes if kind is nn.Upsample] == [8, 16, 32, 64]


def flops(module, *inputs) -> dict:
    with FlopCounterMode(display=False) as counter:
        module(*inputs)
    return {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}


def conv_flops(side: int, ins: int, outs: int) -> int:
    """One K x K convolution evaluated at side x side output positions."""
    return 2 * side * side * ins * outs * KERNEL * KERNEL


def test_the_stride_one_cnns_cost_four_times_the_strided_convolution_flops():
    """A stride-1 convolution evaluates every input position where a stride-2 one (or a
    stride-2 transposed one, per input position) covers a quarter of them, with the same
    weight shapes: exactly 4x the convolution FLOPs. Max-pool, upsample, norm and SiLU
    count no FLOPs; only the decoders' input projections differ besides, so the
    decoder's total ratio is 4 up to (projection FLOPs) / (convolution FLOPs)."""
    depth, side, channels = 4, 64, 3
    image = torch.randint(0, 256, (1, channels, side, side), dtype=torch.uint8)
    state, belief = torch.randn(1, STATE), torch.randn(1, BELIEF)
    ours = flops(PoolingImageEncoder(channels, depth, CNN_MULTS), image)
    torchrls = flops(DreamerV3ImageEncoder(channels, depth, CNN_MULTS), image)
    assert set(ours) == set(torchrls) == {"aten.convolution"}
    widths = [channels, *(depth * mult for mult in CNN_MULTS)]
    expected = sum(
        conv_flops(side >> stage, widths[stage], widths[stage + 1]) for stage in range(4)
    )
    assert ours["aten.convolution"] == expected
    assert ours["aten.convolution"] == 4 * torchrls["aten.convolution"]

    ours = flops(
        UpsamplingImageDecoder(STATE, BELIEF, (channels, side, side), depth, CNN_MULTS, UNITS),
        state,
        belief,
    )
    torchrls = flops(
        DreamerV3ImageDecoder(STATE + BELIEF, (channels, side, side), depth, CNN_MULTS),
        torch.cat([state, belief], -1),
    )
    convolutions = ours.pop("aten.convolution")
    theirs = torchrls.pop("aten.convolution")
    assert convolutions == 4 * theirs
    assert convolutions == sum(  # upsampled to side / 8 ... side before each conv
        conv_flops(side >> stage, widths[stage + 1], widths[stage]) for stage in range(4)
    )
    ours, torchrls = sum(ours.values()), sum(torchrls.values())  # the projections
    smallest = depth * CNN_MULTS[-1] * (side // 16) ** 2
    assert ours == 2 * (BELIEF * smallest // 8 + STATE * 2 * UNITS + 2 * UNITS * smallest)
    assert torchrls == 2 * (STATE + BELIEF) * smallest // 8
    ratio = (convolutions + ours) / (theirs + torchrls)
    assert abs(ratio - 4) <= 4 * max(ours, torchrls) / theirs


@pytest.fixture(scope="module")
def pixels():
    cfg = load(["experiment=smoke", "env=crafter", "model.cnn_strided=false"])
    assert cfg.model.cnn_strided is False and load(["env=crafter"]).model.cnn_strided
    spaces, batch = real_batch(cfg, cfg.replay.batch, cfg.replay.length)
    assert [key.kind for key in spaces.obs] == ["image"]
    return cfg, spaces, batch


def test_a_learner_update_acts_and_rebuilds_with_the_stride_one_cnns(pixels):
    cfg, spaces, batch = pixels
    torch.manual_seed(0)
    agent = build_agent(cfg.model, cfg.learner, spaces)
    learner = Learner(agent, cfg.learner, torch.device("cpu"))
    encoder, decoder = agent.world_model.module[0].module, agent.world_model.module[2].module
    assert isinstance(encoder.cnns[0], PoolingImageEncoder)
    assert isinstance(decoder.cnns[0], UpsamplingImageDecoder)
    cnn_parameters = [*encoder.cnns.parameters(), *decoder.cnns.parameters()]
    before = [p.detach().clone() for p in cnn_parameters]
    metrics = learner.update(batch.clone())
    assert metrics and all(torch.isfinite(v).all() for v in metrics.values())
    assert all(not torch.equal(p, q) for p, q in zip(cnn_parameters, before))
    # acting (the collector's policy) and the policy rebuilt from the loss's weights
    # (dreamer.Policy, dreamer.export) see the same encoder
    observation = batch[0, :3].get(("next", spaces.obs[0].name))
    acting = build_acting(cfg.model, spaces)
    acting.load_state_dict(acting_weights(agent.loss.state_dict(), cfg.model, cfg.learner, spaces))
    with torch.no_grad():
        torch.testing.assert_close(
            acting.module[0].module(observation), agent.policy.module[0].module(observation)
        )
        env = make_env(OmegaConf.to_container(cfg.env), seed=1, latent=latent_sizes(cfg.model))
        rollout = env.rollout(4, acting)
        env.close()
    assert rollout["action"].shape == (4, spaces.action_dim)
    assert torch.isfinite(rollout["next", "belief"]).all()


def test_the_loss_computes_torchrls_losses_with_the_stride_one_cnns(pixels):
    cfg, spaces, batch = pixels
    torch.manual_seed(0)
    loss = build_agent(cfg.model, cfg.learner, spaces).loss
    theirs, their_grads, _ = losses_and_gradients(loss, TorchrlReference(loss), batch, True)
    ours, our_grads, _ = losses_and_gradients(loss, loss, batch, True)
    keys = [key for key in theirs.keys() if key != "replay_context"]
    assert "loss_model_reco" in keys and keys == [k for k in ours.keys() if k != "replay_context"]
    for key in keys:
        torch.testing.assert_close(ours[key], theirs[key], rtol=RTOL, atol=1e-7, msg=key)
    assert their_grads.keys() == our_grads.keys()
    assert len(their_grads) == len(list(loss.parameters()))
    for name, grad in their_grads.items():
        error = relative_error(our_grads[name], grad)
        assert error <= RTOL, (name, float(error))
