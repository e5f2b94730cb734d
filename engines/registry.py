"""Engine name -> EngineSpec (config data) and plug-in module. Imports no torch: used before launch."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

import yaml

from restart_harness import CONFIGS
from restart_harness.errors import UsageError

ENGINES_DIR = CONFIGS / "engines"


def names() -> list[str]:
    return sorted(p.stem for p in ENGINES_DIR.glob("*.yaml"))


@dataclass
class EngineSpec:
    """One engine's configuration data from configs/engines/<name>.yaml."""

    name: str
    module: str
    description: str = ""
    defaults: dict = field(default_factory=dict)  # option -> default value (its type is the option's type)
    choices: dict = field(default_factory=dict)  # option -> accepted values (YAML: <option>_choices)
    ds_config: dict = field(default_factory=dict)  # merged into ds_config.json

    def plugin(self) -> ModuleType:
        return importlib.import_module(self.module)

    def convert_option(self, key: str, text: str) -> object:
        default = self.defaults[key]
        try:
            if isinstance(default, bool):
                from restart_harness.spec.args import parse_bool

                return parse_bool(key, text)
            if isinstance(default, int):
                return int(text)
            if isinstance(default, float):
                return float(text)
        except ValueError:
            raise UsageError(f"{key}={text}: engine {self.name} expects a {type(default).__name__}") from None
        choices = self.choices.get(key)
        if choices and text not in choices:
            raise UsageError(f"{key}={text}: engine {self.name} accepts {', '.join(choices)}")
        return text

    def check_runnable(self, spec: object) -> None:
        """Raise UsageError (one line) when this engine cannot run for spec on this machine."""
        check = getattr(self.plugin(), "check", None)
        if check is not None:
            check(spec)


def get_spec(name: str) -> EngineSpec:
    path = ENGINES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UsageError(f"unknown engine {name!r}; accepted: {', '.join(names())}")
    data = yaml.safe_load(path.read_text()) or {}
    options = data.get("options") or {}
    return EngineSpec(
        name=name,
        module=data.get("module", f"engines.{name}"),
        description=data.get("description", ""),
        defaults={k: v for k, v in options.items() if not k.endswith("_choices")},
        choices={k.removesuffix("_choices"): [str(c) for c in v] for k, v in options.items() if k.endswith("_choices")},
        ds_config=data.get("ds_config") or {},
    )
