"""Model shapes: YAML presets under configs/models/ or a local HF config.json, LlamaConfig's field names, each field a
declared key (group `model`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import MISSING, dataclass
from pathlib import Path

import yaml

from restart_harness import CONFIGS
from restart_harness.errors import UsageError
from restart_harness.files.fsfacts import why_too_long
from restart_harness.spec.keys import check, key, keys_of

MODELS_DIR = CONFIGS / "models"


def _shape(default, help: str, **kw) -> dataclasses.Field:
    return key(default, help, group="model", restart=False, **kw)


@dataclass(frozen=True)
class ModelShape:
    """The LLaMA shape fields the harness uses, named as in transformers' LlamaConfig."""

    hidden_size: int = _shape(MISSING, "model width (a preset's value unless overridden)", minimum=1)
    intermediate_size: int = _shape(MISSING, "SwiGLU feed-forward width", minimum=1)
    num_hidden_layers: int = _shape(MISSING, "decoder layers (at most 1024: eight times the deepest published LLM, "
                                               "Llama 3.1 405B's 126; the planner's pipeline split grows with its "
                                               "square)", minimum=1, maximum=1024)
    num_attention_heads: int = _shape(MISSING, "attention heads", minimum=1)
    num_key_value_heads: int = _shape(MISSING, "key/value heads (grouped-query attention)", minimum=1)
    vocab_size: int = _shape(MISSING, "vocabulary size", minimum=1)
    max_position_embeddings: int = _shape(2048, "longest sequence the model takes", minimum=1)
    rms_norm_eps: float = _shape(1e-5, "RMSNorm epsilon", above=0)
    rope_theta: float = _shape(10000.0, "rotary embedding base", above=0)
    head_dim: int | None = _shape(None, "head dimension (default hidden_size / num_attention_heads)", minimum=1)

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def num_parameters(self) -> int:
        """Parameter count of the untied LLaMA model built by the worker."""
        h, f, v, d = self.hidden_size, self.intermediate_size, self.vocab_size, self.dim_per_head
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
        return self.num_hidden_layers * layer + 2 * v * h + h

    def shrunk(self, k: int) -> ModelShape:
        """Keep layers and heads (so the file layout is the real one); divide head dim, ffn and vocab by k."""
        if k == 1:
            return self
        d = self.dim_per_head // k
        if d < 2 or d % 2:
            raise UsageError(f"shrink={k}: head dimension {self.dim_per_head}/{k} = {d} must be an even number >= 2 "
                             f"(rotary embeddings); accepted: shrink dividing {self.dim_per_head} to an even result")
        return dataclasses.replace(self, hidden_size=d * self.num_attention_heads, head_dim=None,
                                   intermediate_size=max(1, self.intermediate_size // k),
                                   vocab_size=max(1, self.vocab_size // k))


def shape_keys():
    return keys_of(ModelShape)


def preset_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def from_mapping(data: object, source: str) -> ModelShape:
    """A ModelShape from a preset's or config's mapping; unknown fields are ignored, each known one checked."""
    if not isinstance(data, dict):
        raise UsageError(f"model preset {source}: expected a mapping of LlamaConfig fields")
    keys = shape_keys()
    missing = [name for name, k in keys.items() if k.required and name not in data]
    if missing:
        raise UsageError(f"model preset {source}: missing field(s) {', '.join(missing)}")
    values = {}
    for name, k in keys.items():
        if name in data:
            try:
                values[name] = check(k, data[name])
            except UsageError as exc:
                raise UsageError(f"{source}: {exc}") from None
    return ModelShape(**values)


def _read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise UsageError(f"model preset {path}: not safe YAML ({first})") from None


def preset_named(name: str) -> str | None:
    """The preset `name` means, whatever its case (llama3-8b is llama3-8B), or None."""
    return next((p for p in preset_names() if p.lower() == name.lower()), None) if "/" not in name else None


def load_model(name: str) -> tuple[ModelShape, str]:
    """Resolve MODEL: a preset name (any case), or a path to a local HF config.json (or a folder holding one), or a
    .yaml."""
    if why := why_too_long(name):
        raise UsageError(f"model {name!r}: {why}")
    try:
        return _load_model(name)
    except OSError as exc:  # a folder that cannot be listed, a name the file system refuses
        raise UsageError(f"model {name!r}: cannot be read ({exc.strerror or exc})") from None


def _load_model(name: str) -> tuple[ModelShape, str]:
    preset = MODELS_DIR / f"{preset_named(name) or name}.yaml"
    if "/" not in name and preset.is_file():
        return from_mapping(_read_yaml(preset), str(preset)), str(preset)
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.name == "config.json":
        if not path.is_file():
            raise UsageError(f"model {name!r}: no such HF config file {path}")
        return _from_hf_config(path), str(path.resolve())
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise UsageError(f"model {name!r}: no such preset file")
        return from_mapping(_read_yaml(path), str(path)), str(path.resolve())
    raise UsageError(f"unknown model {name!r}; accepted: {', '.join(preset_names())}, a path to an HF config.json, "
                     "or a .yaml preset file")


def _from_hf_config(path: Path) -> ModelShape:
    """Read an HF config.json through transformers' LlamaConfig (fills its defaults, derives head_dim)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"model config {path}: unreadable JSON ({exc})") from None
    keys = shape_keys()
    try:
        from transformers import LlamaConfig
    except ImportError:  # the shape fields are plain JSON; transformers only adds defaults
        return from_mapping(raw, str(path))
    try:
        cfg = LlamaConfig.from_dict({k: v for k, v in raw.items() if k in keys or k == "rope_scaling"})
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for bad configs
        raise UsageError(f"model config {path}: rejected by LlamaConfig ({' '.join(str(exc).split())})") from None
    data = {k: getattr(cfg, k) for k in keys if getattr(cfg, k, None) is not None}
    if "rope_theta" not in raw and isinstance(getattr(cfg, "rope_parameters", None), dict):
        data["rope_theta"] = cfg.rope_parameters.get("rope_theta", 10000.0)
    return from_mapping(data, str(path))
