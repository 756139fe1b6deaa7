"""A transformers `Trainer` run of a tiny GPT-2 on `tpu`, alone or under
`torchrun` (where the Trainer picks the `tpu_dist` backend itself).

    python trainer_ddp.py OUT.json BATCH              # one process
    torchrun --nproc_per_node 2 trainer_ddp.py OUT.json BATCH

BATCH is the per-process batch; the test keeps the global batch equal.
Rank 0 writes the logged losses and a checksum of the trained weights.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import deferfuse  # noqa: F401 - the device and its tpu_dist backend
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, length: int = 8) -> None:
        self.data = torch.randint(0, 64, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main(out: str, batch: int) -> None:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=batch,
            max_steps=3,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
        trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        params = [p.detach().cpu().double() for p in model.parameters()]
        result = {
            "device": str(args.device),
            "world": int(os.environ.get("WORLD_SIZE", "1")),
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "weights": sum(p.sum().item() for p in params),
            "weights_abs": sum(p.abs().sum().item() for p in params),
        }
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
