"""A small training run that checkpoints, for test_checkpoints.py. The test
runs it in its own process; resuming also runs as a script in a new one:

    python checkpoint_training.py CHECKPOINT OUT

loads CHECKPOINT (model, optimizer, tpu generator, step), trains to STEPS
in the mode TORCH_TPU_EAGER_MODE names, and saves the model's state dict to OUT.
"""

import sys

import deferfuse  # noqa: F401 - sets up `tpu` even where torch's backend autoload is off
import torch

STEPS = 10

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
}


def make(optimizer: str):
    """The model (with dropout, so that the tpu generator's state matters) and its optimizer."""
    torch.manual_seed(0)
    torch.tpu.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4)
    ).to("tpu")
    return model, OPTIMIZERS[optimizer](model.parameters())


def batches():
    data = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=data), torch.randn(4, 4, generator=data)) for _ in range(STEPS)]


def train(model, opt, start: int, stop: int) -> None:
    data = batches()
    for step in range(start, stop):
        x, y = (t.to("tpu") for t in data[step])
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def checkpoint(model, opt, optimizer: str, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "optimizer_name": optimizer,
        "tpu_rng": torch.tpu.get_rng_state(),
        "step": step,
    }


def resume(path) -> torch.nn.Module:
    ckpt = torch.load(path, weights_only=True)
    model, opt = make(ckpt["optimizer_name"])
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    torch.tpu.set_rng_state(ckpt["tpu_rng"])
    train(model, opt, ckpt["step"], STEPS)
    return model


if __name__ == "__main__":
    torch.save(resume(sys.argv[1]).state_dict(), sys.argv[2])
