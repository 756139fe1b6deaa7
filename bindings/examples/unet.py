"""UNet (diffusers' `UNet2DModel`, random weights) trained on the denoising
loss with AdamW, then a `DDPMPipeline(...).to("tpu")` sampling a few steps,
on `tpu` against CPU eager.

    python bindings/examples/unet.py [--size tiny|small] [--steps 5] [--compile]

The noise comes from CPU generators, so both devices see the same numbers.
Tolerance: 1e-4 relative on each loss and on the mean of the sampled image
(float32 convolutions and group norms, sums in another order).
"""

from __future__ import annotations

import diffusers
import torch
from _runner import Timer, main

SIZES = {"tiny": (16, (16, 32), 4), "small": (32, (32, 64, 64), 8)}  # (image side, channels, batch)


def train(device: str, steps: int, size: str, compiled: bool, timer: Timer) -> list[float]:
    side, channels, batch = SIZES[size]
    levels = len(channels)
    unet = diffusers.UNet2DModel(
        sample_size=side,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=channels,
        down_block_types=("DownBlock2D",) * (levels - 1) + ("AttnDownBlock2D",),
        up_block_types=("AttnUpBlock2D",) + ("UpBlock2D",) * (levels - 1),
        norm_num_groups=8,
    ).to(device)
    run = torch.compile(unet, backend="tpu" if device == "tpu" else "inductor") if compiled else unet
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100)
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        images = torch.randn(batch, 3, side, side, generator=g)
        noise = torch.randn(images.shape, generator=g)
        t = torch.randint(0, 100, (batch,), generator=g)
        noisy = scheduler.add_noise(images, noise, t)
        with timer:
            opt.zero_grad()
            pred = run(noisy.to(device), t.to(device)).sample
            loss = torch.nn.functional.mse_loss(pred, noise.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    pipe = diffusers.DDPMPipeline(unet=unet, scheduler=scheduler).to(device)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        image = pipe(
            batch_size=1, generator=torch.Generator().manual_seed(2), num_inference_steps=3, output_type="np"
        )
    losses.append(float(image.images.mean()))
    return losses


if __name__ == "__main__":
    main("UNet", train, tolerance=1e-4)
