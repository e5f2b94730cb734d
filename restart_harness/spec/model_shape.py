"""Model shapes: YAML presets under configs/models/ or a local HF config.json, LlamaConfig field names."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from restart_harness import CONFIGS
from restart_harness.errors import UsageError

MODELS_DIR = CONFIGS / "models"


@dataclass(frozen=True)
class ModelShape:
    """The LLaMA shape fields the harness uses, named as in transformers' LlamaConfig."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    head_dim: int | None = None

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def num_parameters(self) -> int:
        """Parameter count of the untied LLaMA model built by the worker."""
        h, f, v, d = self.hidden_size, self.intermediate_size, self.vocab_size, self.dim_per_head
        q = self.num_attention_heads * d
        kv = self.num_key_value_heads * d
        layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
        return self.num_hidden_layers * layer + 2 * v * h + h

    def shrunk(self, k: int) -> ModelShape:
        """Keep layers and heads (so the file layout is the real one); divide head dim, ffn and vocab by k."""
        if k == 1:
            return self
        d = self.dim_per_head // k
        if d < 2 or d % 2:
            raise UsageError(
                f"shrink={k}: head dimension {self.dim_per_head}/{k} = {d} must be an even number >= 2 "
                f"(rotary embeddings); accepted: shrink dividing {self.dim_per_head} to an even result"
            )
        return dataclasses.replace(
            self,
            hidden_size=d * self.num_attention_heads,
            head_dim=None,
            intermediate_size=max(1, self.intermediate_size // k),
            vocab_size=max(1, self.vocab_size // k),
        )


FIELDS = {f.name: f for f in dataclasses.fields(ModelShape)}


def preset_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def _from_mapping(data: object, source: str) -> ModelShape:
    if not isinstance(data, dict):
        raise UsageError(f"model preset {source}: expected a mapping of LlamaConfig fields")
    known = {k: v for k, v in data.items() if k in FIELDS}
    missing = [n for n, f in FIELDS.items() if f.default is dataclasses.MISSING and n not in known]
    if missing:
        raise UsageError(f"model preset {source}: missing field(s) {', '.join(missing)}")
    values = {}
    for key, value in known.items():
        values[key] = cast_field(key, value, source)
    return ModelShape(**values)


def cast_field(key: str, value: object, source: str) -> int | float | None:
    """Check one shape field's value against its type; one clear line when it does not fit."""
    want = FIELDS[key].type
    if value is None and "None" in str(want):
        return None
    if "int" in str(want):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UsageError(f"{source}: {key}={value!r} must be a positive integer")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UsageError(f"{source}: {key}={value!r} must be a positive number")
    return float(value)


def load_model(name: str) -> tuple[ModelShape, str]:
    """Resolve MODEL: a preset name, or a path to a local HF config.json (or a folder holding one)."""
    preset = MODELS_DIR / f"{name}.yaml"
    if "/" not in name and preset.is_file():
        try:
            data = yaml.safe_load(preset.read_text())
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0]
            raise UsageError(f"model preset {preset}: not safe YAML ({first})") from None
        return _from_mapping(data, str(preset)), str(preset)
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
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0]
            raise UsageError(f"model preset {path}: not safe YAML ({first})") from None
        return _from_mapping(data, str(path)), str(path.resolve())
    raise UsageError(
        f"unknown model {name!r}; accepted: {', '.join(preset_names())}, "
        "a path to an HF config.json, or a .yaml preset file"
    )


def _from_hf_config(path: Path) -> ModelShape:
    """Read an HF config.json through transformers' LlamaConfig (fills its defaults, derives head_dim)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"model config {path}: unreadable JSON ({exc})") from None
    try:
        from transformers import LlamaConfig
    except ImportError:  # the shape fields are plain JSON; transformers only adds defaults
        return _from_mapping(raw, str(path))
    try:
        cfg = LlamaConfig.from_dict({k: v for k, v in raw.items() if k in FIELDS or k == "rope_scaling"})
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for bad configs
        raise UsageError(f"model config {path}: rejected by LlamaConfig ({exc})") from None
    data = {k: getattr(cfg, k) for k in FIELDS if getattr(cfg, k, None) is not None}
    if "rope_theta" not in raw and isinstance(getattr(cfg, "rope_parameters", None), dict):
        data["rope_theta"] = cfg.rope_parameters.get("rope_theta", 10000.0)
    return _from_mapping(data, str(path))
