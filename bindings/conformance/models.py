"""Runs `transformers` models built from small configs (random weights, no
download: HF_HUB_OFFLINE=1) on `tpu` in each mode and compares them with CPU
eager; two of them also take one training step.

    python bindings/conformance/models.py [--modes strict,debug,defer_and_fuse] [--models gpt2,bert] [--json]

Prints one row per model and mode: ran / matched / max abs difference / the
aten ops that fell back to the CPU. Tolerance (float32): |tpu - cpu| <=
1e-4 + 1e-4 * |cpu| elementwise on the model's main output (logits or last
hidden state); for training, the same on every parameter after one SGD step.
Debug mode runs with TORCH_TPU_DEBUG_CHECKS=nan: the models' attention masks
hold -inf on purpose.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import warnings
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")
# Attention masks hold -inf on purpose, so Debug mode checks for NaN only here
# (with the default nan,inf it stops at the first mask, naming the op).
os.environ.setdefault("TORCH_TPU_DEBUG_CHECKS", "nan")
warnings.filterwarnings("ignore")

import deferfuse  # noqa: E402
import torch  # noqa: E402

RTOL = ATOL = 1e-4
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99)


def _text(cls_name: str, config_name: str, **overrides: Any) -> Callable[[], tuple[torch.nn.Module, dict]]:
    def build() -> tuple[torch.nn.Module, dict]:
        import transformers

        config = getattr(transformers, config_name)(**overrides)
        model = getattr(transformers, cls_name)(config)
        ids = torch.randint(0, 99, (2, 12))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if "T5" in cls_name or "Bart" in cls_name:
            inputs["decoder_input_ids"] = torch.randint(0, 99, (2, 7))
        return model, inputs

    return build


def _vit() -> tuple[torch.nn.Module, dict]:
    import transformers

    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, **SMALL)
    return transformers.ViTModel(config), {"pixel_values": torch.randn(2, 3, 16, 16)}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, dict]]] = {
    "gpt2": _text(
        "GPT2LMHeadModel", "GPT2Config", n_embd=32, n_layer=2, n_head=4, vocab_size=99, n_positions=64
    ),
    "bert": _text("BertForMaskedLM", "BertConfig", max_position_embeddings=64, **SMALL),
    "llama": _text(
        "LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2, max_position_embeddings=64, **SMALL
    ),
    "t5": _text(
        "T5ForConditionalGeneration",
        "T5Config",
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        vocab_size=99,
    ),
    "vit": _vit,
    "distilbert": _text(
        "DistilBertModel",
        "DistilBertConfig",
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        vocab_size=99,
        max_position_embeddings=64,
    ),
    "roberta": _text("RobertaModel", "RobertaConfig", max_position_embeddings=64, pad_token_id=1, **SMALL),
    "mistral": _text(
        "MistralForCausalLM", "MistralConfig", num_key_value_heads=2, max_position_embeddings=64, **SMALL
    ),
    "qwen2": _text(
        "Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2, max_position_embeddings=64, **SMALL
    ),
    "opt": _text(
        "OPTForCausalLM",
        "OPTConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=64,
        vocab_size=99,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    ),
    "bart": _text(
        "BartModel",
        "BartConfig",
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=99,
        max_position_embeddings=64,
    ),
    "albert": _text("AlbertModel", "AlbertConfig", embedding_size=16, max_position_embeddings=64, **SMALL),
}
TRAINED = ("gpt2", "bert")


def _main_output(out: Any) -> torch.Tensor:
    for key in ("logits", "last_hidden_state"):
        value = getattr(out, key, None)
        if value is not None:
            return value
    return out[0]


def _max_diff(got: torch.Tensor, expected: torch.Tensor) -> tuple[float, bool]:
    diff = (got.float() - expected.float()).abs()
    ok = bool((diff <= ATOL + RTOL * expected.float().abs()).all()) and got.shape == expected.shape
    return float(diff.max()) if diff.numel() else 0.0, ok


def _on(device: str, inputs: dict) -> dict:
    return {k: v.to(device) for k, v in inputs.items()}


def run_forward(name: str, mode: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    with torch.no_grad():
        expected = _main_output(model(**inputs))
    before = deferfuse.fallback_counts()
    row: dict[str, Any] = {"model": name, "mode": mode, "task": "forward"}
    try:
        with deferfuse.mode(mode), torch.no_grad():
            device_model = copy.deepcopy(model).to("tpu")
            got = _main_output(device_model(**_on("tpu", inputs))).cpu()
        row["max_diff"], row["matched"] = _max_diff(got, expected)
        row["ran"] = True
    except Exception as err:
        row.update(ran=False, matched=False, error=f"{type(err).__name__}: {err}".splitlines()[0][:200])
    row["fell_back"] = sorted(deferfuse.fallback_counts() - before)
    return row


def run_training(name: str, mode: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train()
    model.config.hidden_dropout_prob = 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    labels = inputs["input_ids"]
    device_model = copy.deepcopy(model)

    def step(m: torch.nn.Module, device: str) -> None:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        loss = m(**_on(device, inputs), labels=labels.to(device)).loss
        loss.backward()
        opt.step()

    step(model, "cpu")
    before = deferfuse.fallback_counts()
    row: dict[str, Any] = {"model": name, "mode": mode, "task": "train step"}
    try:
        with deferfuse.mode(mode):
            device_model.to("tpu")
            step(device_model, "tpu")
            worst, ok = 0.0, True
            for p, q in zip(device_model.parameters(), model.parameters()):
                d, good = _max_diff(p.detach().cpu(), q.detach())
                worst, ok = max(worst, d), ok and good
        row.update(ran=True, matched=ok, max_diff=worst)
    except Exception as err:
        row.update(ran=False, matched=False, error=f"{type(err).__name__}: {err}".splitlines()[0][:200])
    row["fell_back"] = sorted(deferfuse.fallback_counts() - before)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="strict,debug,defer_and_fuse")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    rows = []
    for name in a.models.split(","):
        for mode in a.modes.split(","):
            rows.append(run_forward(name, mode))
            if name in TRAINED:
                rows.append(run_training(name, mode))
            r = rows[-1]
            print(f"  {name} {mode}: {'ok' if r['matched'] else r.get('error', 'mismatch')}", file=sys.stderr)
    print(
        f"{'model':11s} {'task':10s} {'mode':15s} {'ran':>4s} {'match':>6s} {'max diff':>9s}  ops that fell back to the CPU"
    )
    for r in rows:
        diff = f"{r['max_diff']:.1e}" if "max_diff" in r else "-"
        note = ", ".join(r["fell_back"]) + (f"  [{r['error']}]" if "error" in r else "")
        print(
            f"{r['model']:11s} {r['task']:10s} {r['mode']:15s} {'yes' if r['ran'] else 'no':>4s} "
            f"{'yes' if r['matched'] else 'no':>6s} {diff:>9s}  {note}"
        )
    ran = sum(r["ran"] for r in rows)
    matched = sum(r["matched"] for r in rows)
    print(
        f"\n{len(rows)} runs: {ran} ran ({100 * ran / len(rows):.0f}%), {matched} matched ({100 * matched / len(rows):.0f}%) "
        f"within rtol={RTOL}, atol={ATOL}"
    )
    if a.json:
        print(json.dumps({"runs": len(rows), "ran": ran, "matched": matched, "rows": rows}))


if __name__ == "__main__":
    main()
