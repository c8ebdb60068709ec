"""Models through transformers: a pretrained folder or cached Hub id, or fresh from a config.

Llama, Qwen2 (q/k/v bias), Qwen3 (q/k norm) and every other causal LM transformers knows.
The attention kernel is chosen by halo.train.models.attention and handed to transformers as its
``attn_implementation``. For FSDP a model is built on the meta device (no weights at all)
and only rank 0 holds a full copy to broadcast from, so no rank materialises the whole model
beside its shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional

from halo.errors import HaloError
from halo.train.config import Model
from halo.train.data.tokenizer import ChatTokenizer

# halo.train.models.attention's backends -> transformers' attn_implementation names.
ATTN_IMPLEMENTATION = {
    "sdpa": "sdpa",
    "fa2": "flash_attention_2",
    "fa3": "flash_attention_3",
    "fa4": "flash_attention_4",
}
# config.json keys that say how a model was saved, not what it is (ignored when comparing).
VOLATILE = {
    "transformers_version",
    "architectures",
    "_name_or_path",
    "dtype",
    "torch_dtype",
    "attn_implementation",
    "_attn_implementation_autoset",
    "use_cache",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
}


try:  # transformers 5 configs are strict dataclasses whose validators raise these
    from huggingface_hub.errors import StrictDataclassError

    _STRICT: tuple[type[Exception], ...] = (StrictDataclassError,)
except ImportError:
    _STRICT = ()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def hf_config(m: Model, tok: ChatTokenizer) -> Any:
    """The model's transformers config: from name_or_path, or built from model.config."""
    from transformers import AutoConfig

    try:
        if m.name_or_path is not None:
            conf = AutoConfig.from_pretrained(m.name_or_path, local_files_only=True)
        else:
            fields = dict(m.config or {})
            model_type = fields.pop("model_type")
            fields.setdefault("vocab_size", tok.vocab_size)
            fields.setdefault("eos_token_id", tok.eos_id)
            fields.setdefault("pad_token_id", tok.pad_id)
            conf = AutoConfig.for_model(model_type, **fields)
    except (OSError, ValueError, KeyError, TypeError, *_STRICT) as exc:
        # The model's own config class is the validator: its rejection is this key's error.
        where = m.name_or_path or "model.config"
        raise HaloError(f"{where}: not a usable model config ({_one_line(exc)})") from None
    if not getattr(conf, "architectures", None):
        # Servers pick the model class from config.json's architectures: without it vLLM
        # resolves "LlamaModel" (no LM head) and serves other logits than the trainer's.
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        conf.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[conf.model_type]]
    if conf.vocab_size < tok.vocab_size:
        raise HaloError(
            f"model: vocab_size {conf.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    return conf


def build(
    m: Model, conf: Any, attention: str, seed: int, device: str | torch.device = "cpu"
) -> nn.Module:
    """A model in fp32 on ``device`` ("meta": shapes only, for sharding before materialising)."""
    from transformers import AutoModelForCausalLM

    impl = ATTN_IMPLEMENTATION[attention]
    if impl == "sdpa" and not _supports_sdpa(conf):
        impl = "eager"  # gpt-oss: its attention sinks have no SDPA kernel in transformers
    torch.manual_seed(seed)
    try:
        if m.name_or_path is not None and str(device) != "meta":
            model = AutoModelForCausalLM.from_pretrained(
                m.name_or_path,
                config=conf,
                attn_implementation=impl,
                dtype=torch.float32,
                local_files_only=True,
            )
        else:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(
                    conf, attn_implementation=impl, dtype=torch.float32
                )
    except Exception as exc:  # the config drives the constructor: what it raises is the input's
        where = m.name_or_path or "model.config"
        raise HaloError(f"{where}: cannot build the model ({_one_line(exc)})") from None
    if m.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _supports_sdpa(conf: Any) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(conf)]
    except KeyError:  # not a causal LM transformers maps: its own build says what it supports
        return True
    return bool(getattr(cls, "_supports_sdpa", True))


def first_forward(
    model: nn.Module, conf: Any, where: str, device: torch.device, length: int
) -> None:
    """One tiny batch through the model before training: a config its class accepts can still
    make the model fail (a bad activation name, a rope setting), and that is an input error,
    not a failure in step 1. Eval mode and no gradients: no dropout draws, no state changed.
    ``length`` tokens: some settings break only at later positions (a negative rope_theta)."""
    vocab = int(getattr(conf, "vocab_size", 1) or 1)  # conf: a DDP/FSDP wrapper has no .config
    ids = (torch.arange(length, device=device) % vocab).unsqueeze(0)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            result = model(input_ids=ids, use_cache=False)
            # A causal LM or classifier gives logits, an encoder its hidden states.
            out = getattr(result, "logits", None)
            out = result.last_hidden_state if out is None else out
    except Exception as exc:  # whatever the model raises, the config is what made it
        raise HaloError(f"{where}: the model fails its first forward ({_one_line(exc)})") from None
    finally:
        model.train(was_training)
    if not bool(torch.isfinite(out).all()):
        raise HaloError(f"{where}: the model's first forward gives non-finite logits")


def restore_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute non-persistent buffers (rotary tables) after ``to_empty`` left them garbage.

    They are not in any state dict, so loading weights does not fix them; each module that
    owns one is built again (small: no weights) on ``device`` and its buffers copied over.
    """
    conf = model.config
    for module in model.modules():
        names = getattr(module, "_non_persistent_buffers_set", set())
        if not names:
            continue
        try:
            with torch.device(device):
                fresh = type(module)(conf)
        except TypeError as exc:
            raise HaloError(
                f"model: cannot rebuild {type(module).__name__} after meta init ({exc})"
            ) from None
        for name in names:
            setattr(module, name, getattr(fresh, name).to(device))


def architecture(conf: Any) -> dict[str, Any]:
    """What must match for weights to fit: the config minus how and where it was saved."""
    return {k: v for k, v in conf.to_dict().items() if k not in VOLATILE}


def logits(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    kwargs = {k: batch[k] for k in ("attention_mask", "position_ids") if k in batch}
    return model(input_ids=batch["input_ids"], use_cache=False, **kwargs).logits


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target_t | prefix) per position, computed in fp32."""
    return -functional.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), reduction="none"
    ).view_as(targets)


def batch_logprobs(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return token_logprobs(logits(model, batch), batch["targets"])
