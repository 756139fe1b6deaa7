"""The model zoo: every transformers architecture with an `AutoModel`
mapping, shrunk to a small random-weight config, run forward on CPU and then
on `tpu` in one mode, every floating output compared.

    .venv/bin/python bindings/conformance/zoo.py [--mode defer_and_fuse] [--sample | --models a,b]
        [--train] [--jobs 2] [--timeout 180] [--csv FILE] [--json]

Method. For each architecture: its config with the sizes below (hidden 64,
2 layers, 4 heads, vocab 128, image 32, dropout 0, applied to every
sub-config that has those fields; where that config does not run on CPU,
the default widths with 2 layers), random weights (seed 0), inputs made
from the forward's main argument (token ids, pixels, audio samples or
features). The architecture is *tried* when that forward runs on CPU; it
*ran* when it also runs on `tpu`, and *matched* when every floating output
satisfies |tpu - cpu| <= 1e-4 + 1e-4 * max|cpu| (float32). Each
architecture runs in its own process (forked from a server that has
imported torch, transformers and deferfuse once), with a timeout and a
12 GiB cap on its resident memory; one that cannot be built or run on CPU
is *skipped*, with the reason. A default-widths config is first built and
run on the meta device (shapes only): its weights over the cap, or a
forward that fails there as it would on CPU, skip it without initializing
the weights. `--train` adds one SGD step (lr 0.1) on the sum of the main
output, compared parameter by parameter with the same tolerance.

The summary groups failures by their first line and counts, for every op
that fell back to the CPU, the models that used it. With `--json` the last
line is one JSON object: tried, ran, matched, skipped, fell_back (models
that touched the CPU fallback at all), trained, train_matched.

`--sample` runs SAMPLE, the fixed list CI runs (about 30 architectures of
every kind, a few minutes); docs/results/zoo.md has a full sweep.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import json
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_TPU_CACHE_DIR", "off")
# Attention masks hold -inf on purpose: Debug mode checks for NaN only here.
os.environ.setdefault("TORCH_TPU_DEBUG_CHECKS", "nan")

RTOL = ATOL = 1e-4
MEMORY_CAP = 12 << 30

#: Field -> value, set on every config and sub-config that has the field.
SIZES: dict[str, Any] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "hidden_dim_model"), 64),
    **dict.fromkeys(
        (
            "num_hidden_layers",
            "num_layers",
            "n_layer",
            "n_layers",
            "encoder_layers",
            "decoder_layers",
            "num_encoder_layers",
            "num_decoder_layers",
        ),
        2,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
        ),
        4,
    ),
    **dict.fromkeys(("num_key_value_heads",), 2),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "d_ff",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "n_inner",
            "hidden_dim",
        ),
        128,
    ),
    "rotary_dim": 8,
    "vocab_size": 128,
    "image_size": 32,
    "max_position_embeddings": 128,
    **dict.fromkeys(
        (
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "dropout",
            "attention_dropout",
            "activation_dropout",
            "hidden_dropout",
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
            "dropout_rate",
            "classifier_dropout",
            "layerdrop",
            "drop_path_rate",
        ),
        0.0,
    ),
    # Randomness inside the forward, fixed so that both devices compute the
    # same thing (VITS's sampling noise; ViT-MAE's masking noise is an input,
    # see `_inputs`). The engine's generator draws other numbers than the CPU's.
    **dict.fromkeys(("noise_scale", "noise_scale_duration"), 0.0),
}

TOKEN_IDS = (
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
    "cls_token_id", "mask_token_id", "unk_token_id",
)  # fmt: skip

#: A fixed sample of every kind (decoders, encoders, encoder-decoders, MoE,
#: vision, audio), which CI runs.
SAMPLE = [
    "albert", "bart", "bert", "bloom", "convnext", "deit", "distilbert", "electra", "falcon", "gemma",
    "gpt2", "gpt_neox", "gptj", "llama", "mistral", "mixtral", "mobilebert", "mpt", "opt", "phi",
    "qwen2", "qwen2_moe", "resnet", "roberta", "segformer", "swin", "t5", "vit", "wav2vec2", "whisper",
]  # fmt: skip


#: The fields a second try keeps at their defaults (widths some
#: architectures tie to other fields: hidden sizes per stage, window sizes).
WIDTHS = (
    frozenset(SIZES)
    - {f for f in SIZES if "layers" in f or f.startswith("n_layer")}
    - set(f for f in SIZES if isinstance(SIZES[f], float))
)


def _shrink(config: Any, widths: bool = True, seen: set[int] | None = None) -> None:
    seen = seen if seen is not None else set()
    if id(config) in seen:
        return
    seen.add(id(config))
    for field, value in SIZES.items():
        if not widths and field in WIDTHS:
            continue
        if hasattr(config, field) and isinstance(getattr(config, field), (int, float)):
            try:
                setattr(config, field, value)
            except AttributeError:  # a property computed from other fields
                pass
    # Special tokens past the shrunk vocabulary become small ids.
    vocab = getattr(config, "vocab_size", None)
    for field in TOKEN_IDS:
        value = getattr(config, field, None)
        if isinstance(vocab, int) and isinstance(value, int) and value >= vocab:
            setattr(config, field, 1 + TOKEN_IDS.index(field) % 3)
        elif isinstance(vocab, int) and isinstance(value, list):
            setattr(config, field, [v if v < vocab else 2 for v in value])
    for name in ("text_config", "vision_config", "audio_config", "encoder", "decoder", "backbone_config"):
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _shrink(sub, widths, seen)


def _inputs(build: Any, config: Any) -> dict:
    """Inputs for the first argument of the forward of the model class
    `build`, by its name: known before the model is built (and its weights
    initialized, the slow part of a large one)."""
    import inspect

    import torch

    g = torch.Generator().manual_seed(1)
    params = [p for p in inspect.signature(build.forward).parameters if p != "self"]
    first = params[0] if params else ""
    vocab = getattr(config, "vocab_size", None) or 128
    if first == "input_ids":
        ids = torch.randint(0, min(vocab, 128), (2, 12), generator=g)
        inputs = {"input_ids": ids}
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones_like(ids)
        if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(0, min(vocab, 128), (2, 7), generator=g)
        return inputs
    if first == "pixel_values":
        channels = getattr(config, "num_channels", 3)
        side = getattr(config, "image_size", 32)
        side = side[0] if isinstance(side, (list, tuple)) else side
        inputs = {"pixel_values": torch.randn(2, channels, side, side, generator=g)}
        patch = getattr(config, "patch_size", None)
        if "noise" in params and isinstance(patch, int):
            # Masking noise (ViT-MAE) as an input: the same draw on both devices.
            inputs["noise"] = torch.rand(2, (side // patch) ** 2, generator=g)
        return inputs
    if first == "input_values":
        return {"input_values": torch.randn(2, 4000, generator=g)}
    if first == "input_features":
        bins = getattr(config, "num_mel_bins", 80)
        inputs = {
            "input_features": torch.randn(
                2, bins, 3000 if "whisper" in type(config).__name__.lower() else 64, generator=g
            )
        }
        if "decoder_input_ids" in params:
            inputs["decoder_input_ids"] = torch.randint(0, min(vocab, 128), (2, 4), generator=g)
        return inputs
    raise NoInputs(f"no inputs for a forward whose first argument is {first!r}")


class NoInputs(ValueError):
    """The runner cannot make inputs for this forward (whatever the config)."""


def _on_meta(build: Any, config: Any, inputs: dict) -> tuple[int, str | None]:
    """Builds the model on the meta device (no memory, no initialization,
    no arithmetic: shapes only). Returns the bytes its weights would hold
    (0 when even that fails) and the error of a forward there, if that
    error would be the CPU's too: one that names the meta device (a read
    of values, `.item()`; devices mixed) says nothing about the CPU."""
    import torch

    try:
        with torch.device("meta"):
            model = build(config).eval()
    except Exception:
        return 0, None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        with torch.no_grad():
            model(**{k: v.to("meta") for k, v in inputs.items()})
    except Exception as err:
        why = f"{type(err).__name__}: {err}".splitlines()[0][:160]
        return weights, None if "meta" in why.lower() else why
    return weights, None


def _floats(out: Any) -> list[Any]:
    """Every floating tensor in a model's output, in order."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _floats(o)]
    return []


def _compare(got: list[Any], want: list[Any]) -> tuple[bool, float]:
    if len(got) != len(want):
        return False, float("inf")
    worst, ok = 0.0, True
    for a, b in zip(got, want):
        if a.shape != b.shape:
            return False, float("inf")
        if b.numel() == 0:
            continue
        a, b = a.float(), b.float()
        diff = (a - b).abs()
        close = (diff <= ATOL + RTOL * b.abs().max()) | (a.isnan() & b.isnan())
        worst = max(worst, diff.nan_to_num(0.0).max().item())
        ok = ok and bool(close.all())
    return ok, worst


def child(model_type: str, mode: str, train: bool, report: Any = None) -> dict[str, Any]:
    """Runs one architecture; returns its row (and hands `report` the row
    as it stands once the CPU forward ran)."""
    import copy
    import resource
    import warnings

    warnings.filterwarnings("ignore")
    # A backstop only: the parent caps resident memory (`_run_one`). A `tpu`
    # storage reserves host address space that it never touches, so an
    # address-space cap would count the model twice on `tpu`.
    resource.setrlimit(resource.RLIMIT_AS, (4 * MEMORY_CAP, 4 * MEMORY_CAP))
    import deferfuse
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    row: dict[str, Any] = {"model": model_type, "mode": mode, "tried": False, "ran": False, "matched": False}
    # Every size shrunk first; where that config does not run on CPU, the
    # default widths with two layers.
    for widths in (True, False):
        try:
            build = getattr(transformers, MODEL_MAPPING_NAMES[model_type])
            config = CONFIG_MAPPING[model_type]()
            _shrink(config, widths)
            inputs = _inputs(build, config)
            # Default widths can mean gigabytes of weights, and initializing
            # them takes up to minutes: a model whose weights alone pass the
            # cap, or whose forward fails on the meta device already, is
            # not built.
            if not widths:
                weights, why = _on_meta(build, config, inputs)
                if weights > MEMORY_CAP:
                    row["skipped"] = f"over the {MEMORY_CAP >> 30} GiB memory cap (its weights alone)"
                    break
                if why is not None:
                    row["skipped"] = f"on the meta device: {why}"
                    break
            torch.manual_seed(0)
            model = build(config).eval()
            with torch.no_grad():
                want = _floats(model(**inputs))
            row.pop("skipped", None)
            break
        except (NoInputs, ImportError) as err:  # the same with any config: no second try
            row["skipped"] = f"{type(err).__name__}: {err}".splitlines()[0][:160]
            break
        except Exception as err:  # not ours: the architecture does not run on CPU like this
            row["skipped"] = f"{type(err).__name__}: {err}".splitlines()[0][:160]
    if "skipped" in row:
        return row
    row["tried"] = True
    # Reported now, so that a process that dies on `tpu` counts as tried.
    if report is not None:
        report(dict(row))
    before = deferfuse.fallback_counts()
    try:
        with deferfuse.mode(mode), torch.no_grad():
            # Moved, not copied, unless the training step needs the CPU model:
            # a copy would hold the weights three times while they move.
            device_model = (copy.deepcopy(model) if train else model).to("tpu")
            got = [t.cpu() for t in _floats(device_model(**{k: v.to("tpu") for k, v in inputs.items()}))]
        row["ran"] = True
        row["matched"], row["max_diff"] = _compare(got, want)
    except Exception as err:
        row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:160]
    if train and row["ran"]:
        row.update(_train_step(model, inputs, mode))
    row["fell_back"] = sorted(deferfuse.fallback_counts() - before)
    return row


def _train_step(model: Any, inputs: dict, mode: str) -> dict[str, Any]:
    import copy

    import deferfuse
    import torch

    def step(m: Any, device: str) -> list[Any]:
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        _floats(m(**{k: v.to(device) for k, v in inputs.items()}))[0].float().mean().backward()
        opt.step()
        return [p.detach().cpu() for p in m.parameters()]

    cpu_model = copy.deepcopy(model)
    try:
        want = step(cpu_model, "cpu")
    except Exception:
        return {}
    try:
        with deferfuse.mode(mode):
            got = step(copy.deepcopy(model).to("tpu"), "tpu")
        ok, _ = _compare(got, want)
        return {"trained": True, "train_matched": ok}
    except Exception as err:
        return {"trained": True, "train_matched": False, "train_error": f"{type(err).__name__}: {err}"[:160]}


def _child_main(model_type: str, mode: str, train: bool, conn: Any) -> None:
    row = child(model_type, mode, train, lambda tried: conn.send(("tried", tried)))
    conn.send(("final", row))


def _resident_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _run_one(model_type: str, mode: str, train: bool, timeout: float) -> dict[str, Any]:
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(model_type, mode, train, send), daemon=True)
    start = time.perf_counter()
    process.start()
    send.close()
    row: dict[str, Any] = {"model": model_type, "mode": mode, "tried": False}
    died = None
    while True:
        if receive.poll(0.25):
            try:
                kind, row = receive.recv()
            except EOFError:
                died = f"process died (exit code {process.exitcode})"
                break
            if kind == "final":
                break
            continue
        if not process.is_alive() and not receive.poll(0):
            died = f"process died (exit code {process.exitcode})"
            break
        if time.perf_counter() - start > timeout:
            died = f"timeout after {timeout:.0f} s"
            break
        if _resident_bytes(process.pid) > MEMORY_CAP:
            died = f"over the {MEMORY_CAP >> 30} GiB memory cap"
            break
    if process.is_alive():
        process.kill()
    process.join()
    receive.close()
    if died is not None:
        # After the CPU forward (the child's first report): a failure on `tpu`.
        row["error" if row.get("tried") else "skipped"] = died
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tried = [r for r in rows if r.get("tried")]
    fell = collections.Counter(op for r in tried for op in r.get("fell_back", []))
    return {
        "tried": len(tried),
        "ran": sum(bool(r.get("ran")) for r in tried),
        "matched": sum(bool(r.get("matched")) for r in tried),
        "skipped": len(rows) - len(tried),
        "fell_back": sum(bool(r.get("fell_back")) for r in tried),
        "trained": sum(bool(r.get("trained")) for r in tried),
        "train_matched": sum(bool(r.get("train_matched")) for r in tried),
        "fallback_ops": dict(fell.most_common()),
        "failures": dict(
            collections.Counter(
                r.get("error") or f"max difference {r.get('max_diff')}" for r in tried if not r.get("matched")
            ).most_common()
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="defer_and_fuse", choices=["strict", "debug", "defer_and_fuse"])
    parser.add_argument("--sample", action="store_true", help="the fixed sample CI runs")
    parser.add_argument(
        "--models", help="comma-separated model types (default: every AutoModel architecture)"
    )
    parser.add_argument("--train", action="store_true", help="also one SGD step")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--csv", help="write one row per architecture here")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.mode, args.train)))
        return
    import multiprocessing

    # Each architecture's process forks from a server that imported these
    # once (about 6 s an architecture otherwise).
    multiprocessing.set_forkserver_preload(["torch", "transformers", "deferfuse"])
    if args.models:
        names = args.models.split(",")
    elif args.sample:
        names = SAMPLE
    else:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        names = sorted(MODEL_MAPPING_NAMES)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda n: _run_one(n, args.mode, args.train, args.timeout), names))
    if args.csv:
        keys = ["model", "mode", "tried", "ran", "matched", "max_diff", "trained", "train_matched", "seconds"]
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, keys + ["skipped", "error", "fell_back"], extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({**r, "fell_back": " ".join(r.get("fell_back", []))})
    summary = summarize(rows)
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k not in ("fallback_ops", "failures")}))
        return
    t = max(1, summary["tried"])
    print(
        f"{args.mode}: tried {summary['tried']} (skipped {summary['skipped']}), ran {summary['ran']} "
        f"({summary['ran'] / t:.1%}), matched {summary['matched']} ({summary['matched'] / t:.1%}), "
        f"touched the CPU fallback {summary['fell_back']}"
        + (f", train steps matched {summary['train_matched']} of {summary['trained']}" if args.train else "")
    )
    for error, n in summary["failures"].items():
        print(f"  {n:3d}  {error}")
    for op, n in list(summary["fallback_ops"].items())[:20]:
        print(f"  fallback {op}: {n} models")


if __name__ == "__main__":
    main()
