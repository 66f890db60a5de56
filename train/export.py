"""Writes a trained decoder-only run (a language model, `--config.task=lm`; a chat model,
`chat`; a preference-tuned one, `dpo`) as a Hugging Face model directory that
`transformers` loads and generates from, or as a GGUF file that llama.cpp and Ollama run.

    python -m train.export --workdir runs/finetune --out /tmp/finetuned
    python -m train.export --workdir runs/finetune --out /tmp/adapters --adapters_only
    python -m train.export --workdir runs/sft --format gguf --out /tmp/sft.gguf [--type q8_0]

The weights of the run's newest checkpoint go to `model.safetensors` (float32) through the
library's exporters (`flax_transformer.export_gpt2` / `export_llama` layouts). A run started
from pretrained weights (`--config.init_from`) is written as the family it came from, with
the source's `config.json` (its architecture is the run's) and tokenizer files, and the
added pad id (`train.data.hf_tokenizer`) removed again, so the directory has the source's
vocabulary and loads wherever the source did; a run with its own chat template (its copy
of `--config.chat_template`, `W/chat_template.jinja`) has it in `tokenizer_config.json`
instead of the source's. LoRA adapters are merged into the weights they adapt
(`flax_transformer.merge_lora`), or with `--adapters_only` written alone
(`adapter_model.safetensors`, `adapter_config.json`) in the names of the PEFT library.

A run trained from scratch is written with the library's config (its own tokenizer is not a
Hugging Face one: its ids are the run's).

`--format gguf` writes one .gguf file (`flax_transformer.write_gguf`, `--type` f32, f16,
bf16 or q8_0) of a Llama-family run started from a pretrained model with a byte-level BPE
(SmolLM2, Llama 3 and other GGUF or Hugging Face Llama starts): LoRA merged, the added pad
id removed, the tokenizer (`GGUFVocab.from_tokenizer` of the run's copy of the model's
`tokenizer.json`) and the chat template (the run's own, its copy of
`--config.chat_template`, else the model's: the one the run trained with) with it. What
llama.cpp cannot run is refused before anything is written. An encoder-decoder (a
translation run) is refused in either format.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import app, flags

from flax_transformer import DecoderOnlyTransformer, GGUFVocab, write_gguf
from flax_transformer.interop.export import gpt2_hf_config, gpt2_tensors, write_hf_directory
from flax_transformer.interop.gguf_layout import WRITE_TYPES
from flax_transformer.interop.llama import EXPORTED_PAD_KEY, llama_hf_config, llama_tensors
from train.core.cli import die, parse_flags, quiet_library_logs
from train.core.failures import USAGE_ERROR
from train.core.rundir import RunDir
from train.data.chat.template import find_chat_template, run_template_file
from train.formats import sources
from train.formats.sources.hf import (
    CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
)
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
    """`export_run` of an already loaded run (`train.program.trained.TrainedModel`).

    A chat or preference run (`--config.task=chat` / `dpo`) is a decoder-only model like a
    language model's: written the same way, with the chat template it trained with in the
    directory's `tokenizer_config.json` (`_write_chat_template`).
    """
    _check_decoder_only(trained, workdir, "a Hugging Face directory")
    model_config, params = _merged(trained.model.config, trained.params)
    source = _hf_origin(pathlib.Path(workdir))
    run_template = _run_template_file(workdir, trained)
    # Read before anything is written (a run from before its copy reads the user's path).
    own_template = (
        _chat_template(source, run_template) if source is not None and run_template else None
    )
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
        if own_template is not None:
            _write_chat_template(out, own_template)
    return out


def _check_decoder_only(trained, workdir, writes: str) -> None:
    """Refuses a run whose model is not decoder-only (a translation run's encoder-decoder),
    naming its task and the tasks whose runs export.

    Raises:
        ValueError: the run's model is not a `DecoderOnlyTransformer`.
    """
    if isinstance(trained.model, DecoderOnlyTransformer):
        return
    from train.tasks import TASKS

    exported = ", ".join(
        repr(name)
        for name, task in TASKS.items()
        if issubclass(task.model_type, DecoderOnlyTransformer)
    )
    raise ValueError(
        f"{workdir} trained task={trained.experiment.data.task!r}, a "
        f"{type(trained.model).__name__}; train.export writes {writes} of a decoder-only "
        f"language model, the model of tasks {exported}."
    )


def _write_chat_template(out: pathlib.Path, template: str) -> None:
    """Puts the run's own chat template (`_run_template_file`) into the exported
    `tokenizer_config.json`, in place of the model's; a copied `chat_template.jinja` (the
    model's, which transformers would read first) is removed."""
    (out / CHAT_TEMPLATE_FILE).unlink(missing_ok=True)
    path = out / TOKENIZER_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _hf_origin(workdir: pathlib.Path) -> sources.HFSource | None:
    """The run's copy of the Hugging Face model it started from (through the copies of runs
    started from runs); None for a run trained from scratch."""
    copy = workdir / sources.SNAPSHOT_DIR
    if not (copy / sources.CONFIG_FILE).is_file():
        return None
    return sources.origin(sources.read_source(copy, need_weights=False))


# The formats `--format` writes.
FORMATS = ("hf", "gguf")


def write_trained_gguf(trained, workdir, out, gguf_type: str = "f16") -> pathlib.Path:
    """Writes a loaded run (`train.program.trained.TrainedModel`) as a GGUF file at `out`:
    LoRA merged, the added pad id removed, the model's tokenizer and chat template.

    Raises:
        ValueError: a run llama.cpp cannot run (an encoder-decoder, a run trained from
            scratch or from GPT-2, a tokenizer without a llama.cpp kind, an option the
            'llama' architecture lacks; named), before anything is written.
    """
    workdir = pathlib.Path(workdir)
    _check_decoder_only(trained, workdir, "a GGUF file")
    vocab, source = gguf_vocab(workdir)
    model_config, params = _merged(trained.model.config, trained.params)
    model_config, params = _without_added_pad(model_config, params, len(vocab), vocab.pad_id)
    template = _chat_template(source, _run_template_file(workdir, trained))
    return write_gguf(out, model_config, {"params": params}, vocab, template, type=gguf_type)


def gguf_vocab(workdir: pathlib.Path) -> tuple[GGUFVocab, sources.HFSource]:
    """The GGUF vocabulary of the model a run started from (its copy in the run's
    `pretrained/`), and that copy.

    Raises:
        ValueError: a run trained from scratch, a GPT-2 start, or a tokenizer llama.cpp has
            no kind for (named).
    """
    from tokenizers import Tokenizer

    source = _hf_origin(workdir)
    if source is None:
        raise ValueError(
            f"{workdir} was trained from scratch: its tokenizer (bytes or SentencePiece, ids "
            "of its own) has no llama.cpp vocabulary here; GGUF export writes runs started "
            "from a pretrained Llama-family model (--config.init_from), or use --format hf."
        )
    if source.family != "llama":
        raise ValueError(
            f"{workdir} started from a {source.family} model; GGUF export writes llama.cpp's "
            "'llama' architecture (Llama, Mistral, SmolLM); use --format hf for GPT-2."
        )
    config = json.loads((source.path / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))

    def token(role: str) -> str | None:
        value = config.get(role)
        return value.get("content") if isinstance(value, dict) else value

    roles = ("bos_token", "eos_token", "unk_token", "pad_token")
    try:
        vocab = GGUFVocab.from_tokenizer(
            Tokenizer.from_file(str(source.path / TOKENIZER_FILE)),
            **{role: token(role) for role in roles},
        )
    except ValueError as err:
        raise ValueError(f"{workdir}: the model's tokenizer: {err}") from None
    return vocab, source


def _without_added_pad(config, params, vocab_size: int, pad_id: int | None):
    """The model with the vocabulary's V ids: the pad id V the program added (a row of the
    embedding, a column of an untied output layer) dropped."""
    if config.vocab_size == vocab_size:
        return config, params
    if (config.vocab_size, config.pad_id) != (vocab_size + 1, vocab_size):
        raise ValueError(
            f"the model has vocab_size={config.vocab_size} (pad_id={config.pad_id}) and its "
            f"tokenizer {vocab_size} tokens; GGUF export drops only an added pad id V."
        )
    params = dict(params, embed={"embedding": params["embed"]["embedding"][:vocab_size]})
    if "logits" in params["decoder"]:
        kernel = params["decoder"]["logits"]["kernel"][:, :vocab_size]
        params["decoder"] = dict(params["decoder"], logits={"kernel": kernel})
    # The file's own padding id (a real token) stands in; llama.cpp masks nothing.
    fields = {"vocab_size": vocab_size, "pad_id": pad_id if pad_id is not None else 0}
    return dataclasses.replace(config, **fields), params


def _run_template_file(workdir, trained) -> str:
    """The run's own chat template file: its copy (`W/chat_template.jinja`, the template it
    trained with), else the `--config.chat_template` path of a run from before the copy was
    kept; '' for a run that used the model's."""
    return run_template_file(RunDir(workdir), trained.experiment.data.chat_template)


def _chat_template(source: sources.HFSource, run_template: str) -> str | None:
    """The run's chat template file (`_run_template_file`), else the model's; None for a
    model without one (a base model)."""
    config = json.loads((source.path / TOKENIZER_CONFIG_FILE).read_text(encoding="utf-8"))
    has_own = (
        config.get("chat_template") is not None or (source.path / CHAT_TEMPLATE_FILE).is_file()
    )
    if not run_template and not has_own:
        return None
    found = find_chat_template(config, directory=source.path, template_file=run_template or None)
    return found.source


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
    flags.DEFINE_string(
        "out",
        None,
        "The Hugging Face directory (or, --format gguf, the file) to write.",
        required=True,
    )
    flags.DEFINE_enum(
        "format", "hf", FORMATS, "hf: a Hugging Face directory; gguf: a GGUF file (llama.cpp)."
    )
    flags.DEFINE_enum(
        "type", "f16", sorted(WRITE_TYPES), "--format gguf: the type of the matrices."
    )
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
    if given.format != "gguf" and given["type"].present:
        die("--type applies to --format gguf; a Hugging Face export is float32.", USAGE_ERROR)
    if given.format == "gguf" and given.adapters_only:
        die("--adapters_only writes PEFT adapters; a GGUF file holds merged weights.", USAGE_ERROR)
    try:
        if given.format == "gguf":
            out = write_trained_gguf(
                tools.load_run(given.workdir), given.workdir, given.out, given.type
            )
            size = out.stat().st_size / 2**20
            print(f"Wrote {out} ({given.type}, {size:.1f} MiB; llama.cpp: llama-cli -m {out})")
            return
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
