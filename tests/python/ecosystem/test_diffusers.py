"""diffusers on tpu against CPU: a DDPM pipeline over a UNet with attention blocks, AutoencoderKL, and a
UNet training step. Every random draw is made on CPU (a CPU generator, or tensors drawn once and passed
in), so both runs see the same numbers whatever the chip's own generator does.

The UNet's and the VAE's attention blocks hand GroupNorm channels-last activations; the generic
math_group_norm that PrivateUse1 got rejected them (`view size is not compatible`).
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL, DDPMPipeline, DDPMScheduler, UNet2DModel
from diffusers.utils import logging as diffusers_logging

diffusers_logging.set_verbosity_error()  # randn_tensor's "generator on cpu" note, once per draw

TOL = {"atol": 2e-5, "rtol": 1e-4}


def tiny_unet():
    torch.manual_seed(0)
    return UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=8,
    )


def tiny_vae():
    torch.manual_seed(0)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=8,
    )


def test_group_norm_channels_last_matches_cpu():
    x = torch.randn(2, 16, 4, 4).to(memory_format=torch.channels_last)
    w, b = torch.randn(16), torch.randn(16)
    out = F.group_norm(x.to("tpu"), 4, w.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(out.cpu(), F.group_norm(x, 4, w, b), **TOL)
    with pytest.raises(RuntimeError, match="num_groups"):
        F.group_norm(x.to("tpu"), 5)


def test_ddpm_pipeline_3_steps_matches_cpu():
    unet = tiny_unet()
    cpu_pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=100))
    cpu_pipe.set_progress_bar_config(disable=True)
    tpu_pipe = DDPMPipeline(unet=copy.deepcopy(unet), scheduler=DDPMScheduler(num_train_timesteps=100)).to("tpu")
    tpu_pipe.set_progress_bar_config(disable=True)
    assert tpu_pipe.device.type == "tpu"
    # A CPU generator: diffusers draws the latents and each step's noise on CPU, then moves them.
    ref = cpu_pipe(generator=torch.Generator().manual_seed(0), num_inference_steps=3, output_type="pt").images
    out = tpu_pipe(generator=torch.Generator().manual_seed(0), num_inference_steps=3, output_type="pt").images
    assert out.device.type == "tpu" and out.shape == (1, 3, 8, 8)
    torch.testing.assert_close(out.cpu(), ref, **TOL)


def test_autoencoder_kl_forward_matches_cpu():
    vae = tiny_vae()
    tvae = copy.deepcopy(vae).to("tpu")
    x, z = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 4, 4)  # drawn once, on CPU
    with torch.no_grad():
        posterior, tposterior = vae.encode(x).latent_dist, tvae.encode(x.to("tpu")).latent_dist
        torch.testing.assert_close(tposterior.mean.cpu(), posterior.mean, **TOL)
        torch.testing.assert_close(tposterior.std.cpu(), posterior.std, **TOL)
        torch.testing.assert_close(tvae.decode(z.to("tpu")).sample.cpu(), vae.decode(z).sample, **TOL)
        ref = vae(x, sample_posterior=False).sample
        torch.testing.assert_close(tvae(x.to("tpu"), sample_posterior=False).sample.cpu(), ref, **TOL)


def test_unet_training_step_matches_cpu():
    unet = tiny_unet()
    tunet = copy.deepcopy(unet).to("tpu")
    sched = DDPMScheduler(num_train_timesteps=100)
    clean, noise = torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)
    t = torch.tensor([3, 70])
    # SGD, not Adam: the key projections' bias gradients are rounding noise (softmax ignores them),
    # which Adam's normalisation would turn into full-size steps of either sign.
    opt = torch.optim.SGD(unet.parameters(), lr=0.1)
    topt = torch.optim.SGD(tunet.parameters(), lr=0.1)
    losses = {}
    for model, dev in ((unet, "cpu"), (tunet, "tpu")):
        noisy = sched.add_noise(clean.to(dev), noise.to(dev), t.to(dev))
        loss = F.mse_loss(model(noisy, t.to(dev)).sample, noise.to(dev))
        loss.backward()
        losses[dev] = loss.detach().cpu()
    torch.testing.assert_close(losses["tpu"], losses["cpu"], **TOL)
    for (name, p), tp in zip(unet.named_parameters(), tunet.parameters()):
        torch.testing.assert_close(tp.grad.cpu(), p.grad, atol=1e-4, rtol=1e-3, msg=name)
    opt.step()
    topt.step()
    for (name, p), tp in zip(unet.named_parameters(), tunet.parameters()):
        torch.testing.assert_close(tp.detach().cpu(), p.detach(), **TOL, msg=name)
