"""Writes a trained language-model run as a Hugging Face model directory that
`transformers` loads and generates from.

    python -m train.export --workdir runs/finetune --out /tmp/finetuned
    python -m train.export --workdir runs/finetune --out /tmp/adapters --adapters_only

The weights of the run's newest checkpoint go to `model.safetensors` (float32) through the
library's exporters (`flax_transformer.export_gpt2` / `export_llama` layouts). A run started
from pretrained weights (`--config.init_from`) is written as the family it came from, with
the source's `config.json` (its architecture is the run's) and tokenizer files, and the
added pad id (`train.data.hf_tokenizer`) removed again, so the directory has the source's
vocabulary and loads wherever the source did. LoRA adapters are merged into the weights
they adapt (`flax_transformer.merge_lora`), or with `--adapters_only` written alone
(`adapter_model.safetensors`, `adapter_config.json`) in the names of the PEFT library.

A run trained from scratch is written with the library's config (its own tokenizer is not a
Hugging Face one: its ids are the run's).
"""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import app, flags

from flax_transformer.interop.export import gpt2_hf_config, gpt2_tensors, write_hf_directory
from flax_transformer.interop.llama import EXPORTED_PAD_KEY, llama_hf_config, llama_tensors
from train.core.cli import die, parse_flags, quiet_library_logs
from train.core.failures import USAGE_ERROR
from train.formats import sources
from train.formats.sources.hf import TOKENIZER_FILES
from train.tools import tools

# Tensors indexed by vocabulary id (rows), per family: where the added pad id is removed.
_VOCAB_TENSORS = {
    "gpt2": ("transformer.wte.weight", "lm_head.weight"),
    "llama": ("model.embed_tokens.weight", "lm_head.weight"),
}


def _family(model) -> str:
    """'llama' for a RoPE + RMSNorm model, else 'gpt2' (the exporters refuse what their
    layout cannot hold, naming the fields)."""
    return "llama" if model.positional == "rope" and model.norm == "rmsnorm" else "gpt2"


def export_run(workdir: str | pathlib.Path, out: str | pathlib.Path) -> pathlib.Path:
    """Writes the run's newest parameters as a Hugging Face directory at `out`.

    Returns:
        `out`.

    Raises:
        ValueError: the run is not a language model, or its model has an option the
            family's layout cannot hold (named).
    """
    from train.program.trained import load_trained

    trained = load_trained(workdir)
    return write_trained(trained, workdir, out)


def write_trained(trained, workdir, out) -> pathlib.Path:
    """`export_run` of an already loaded run (`train.program.trained.TrainedModel`)."""
    if trained.experiment.data.task != "lm":
        raise ValueError(
            f"{workdir} trained task={trained.experiment.data.task!r}; train.export writes "
            "decoder-only language models (task='lm')."
        )
    model_config, params = _merged(trained.model.config, trained.params)
    source = _hf_origin(pathlib.Path(workdir))
    family = source.family if source is not None else _family(model_config)
    to_tensors = gpt2_tensors if family == "gpt2" else llama_tensors
    tensors = to_tensors(model_config, {"params": params})
    tokenizer = trained.tokenizer
    if source is None:
        hf_config = (gpt2_hf_config if family == "gpt2" else llama_hf_config)(
            model_config, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id
        )
    else:
        vocab = int(source.hf_config["vocab_size"])
        for name in _VOCAB_TENSORS[family]:
            if name in tensors and tensors[name].shape[0] == vocab + 1:
                tensors[name] = np.ascontiguousarray(tensors[name][:vocab])
        hf_config = json.loads((source.path / sources.CONFIG_FILE).read_text(encoding="utf-8"))
        hf_config.pop(EXPORTED_PAD_KEY, None)
        for key in ("torch_dtype", "dtype"):  # the tensors written are float32
            if key in hf_config:
                hf_config[key] = "float32"
    out = write_hf_directory(tensors, hf_config, out)
    if source is not None:
        for name in TOKENIZER_FILES:
            if (source.path / name).is_file():
                shutil.copyfile(source.path / name, out / name)
    return out


def _hf_origin(workdir: pathlib.Path) -> sources.HFSource | None:
    """The run's copy of the Hugging Face model it started from (through the copies of runs
    started from runs); None for a run trained from scratch."""
    copy = workdir / sources.SNAPSHOT_DIR
    if not (copy / sources.CONFIG_FILE).is_file():
        return None
    return sources.origin(sources.read_source(copy, need_weights=False))


# Our LoRA targets -> the Llama module each adapts, as PEFT names them.
_PEFT_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
_PARENTS = {"q": "self_attention", "k": "self_attention", "v": "self_attention"}
_PARENTS |= {"o": "self_attention", "gate": "ffn", "up": "ffn", "down": "ffn"}


def export_adapters(workdir: str | pathlib.Path, out: str | pathlib.Path) -> pathlib.Path:
    """Writes a LoRA run's adapters alone, as the PEFT library saves them
    (`adapter_model.safetensors`, `adapter_config.json`): `PeftModel.from_pretrained(base,
    out)` on the source Hugging Face model gives the run's model.

    A Llama-family run only: GPT-2 fuses q, k and v into one `c_attn` weight, where our
    adapters are one per part (export it merged instead).

    Raises:
        ValueError: the run has no adapters, or is not Llama-family.
    """
    from safetensors.numpy import save_file

    from train.program.trained import load_trained

    trained = load_trained(workdir)
    config, params = trained.model.config, trained.params
    if not getattr(config, "lora_rank", 0):
        raise ValueError(
            f"{workdir} has no LoRA adapters (lora_rank=0): export it without --adapters_only."
        )
    if _family(config) != "llama":
        raise ValueError(
            f"--adapters_only writes PEFT adapters of Llama-family models; {workdir} is GPT-2-"
            "style, whose fused c_attn weight PEFT adapts as one: export it merged instead."
        )
    decoder = params["decoder"]
    layers = [
        jax.tree.map(lambda x, i=i: np.asarray(x[i]), decoder["layers"])
        if "layers" in decoder
        else jax.tree.map(np.asarray, decoder[f"layers_{i}"])
        for i in range(config.decoder_layers)
    ]
    r = config.lora_rank
    tensors = {}
    for i, layer in enumerate(layers):
        for target in config.lora_targets:
            pair = layer[_PARENTS[target]][f"lora_{target}"]
            a, b = pair["lora_a"], pair["lora_b"]
            name = f"base_model.model.model.layers.{i}.{_PEFT_MODULES[target]}"
            # PEFT: delta = B @ A with A (r, in), B (out, r); ours: x @ (A' @ B'), A' (in, r).
            tensors[f"{name}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, r).T)
            tensors[f"{name}.lora_B.weight"] = np.ascontiguousarray(b.reshape(r, -1).T)
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.astype(np.float32) for k, v in tensors.items()},
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    snapshot = pathlib.Path(workdir) / sources.SNAPSHOT_DIR / sources.SOURCE_FILE
    base = json.loads(snapshot.read_text())["path"] if snapshot.is_file() else None
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": r,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(_PEFT_MODULES[t].split(".")[-1] for t in config.lora_targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return out


def _merged(model_config, params) -> tuple[Any, Any]:
    """The model without LoRA adapters: each folded into its weight."""
    if not getattr(model_config, "lora_rank", 0):
        return model_config, params
    from flax_transformer import merge_lora

    return merge_lora(model_config, params)


def _define_flags() -> None:
    flags.DEFINE_string("workdir", None, "A train.main run directory.", required=True)
    flags.DEFINE_string("out", None, "The Hugging Face directory to write.", required=True)
    flags.DEFINE_bool(
        "adapters_only",
        False,
        "Write a LoRA run's adapters alone, as PEFT saves them (Llama-family runs).",
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        die(f"unexpected arguments {argv[1:]} ; see --helpshort.", USAGE_ERROR)
    given = flags.FLAGS
    quiet_library_logs()
    try:
        if given.adapters_only:
            out = export_adapters(given.workdir, given.out)
        else:
            out = write_trained(tools.load_run(given.workdir), given.workdir, given.out)
    except (FileNotFoundError, ValueError) as err:
        die(str(err))
    print(f"Wrote {out} (transformers: AutoModelForCausalLM.from_pretrained({str(out)!r}))")


if __name__ == "__main__":
    _define_flags()
    app.run(main, flags_parser=parse_flags)
