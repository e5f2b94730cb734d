"""What a launch preloads into its ranks to observe I/O: the harness's counters for the anatomy and the I/O by
source (anatomy=true) and dftracer for the full trace (trace=true). Returns environment variables for the launch
script; names the sources a rank's paths are counted in (io_sources)."""

from __future__ import annotations

import getpass
import os
import sys
import sysconfig
from pathlib import Path

from restart_harness import SOURCE_ROOT, iocount
from restart_harness.files.cache_dir import extensions_dir
from restart_harness.files.fsfacts import filesystem
from restart_harness.spec.runspec import RunSpec
from third_party import dftracer_compat

SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/var/lib")
PSEUDO = ("/proc", "/sys", "/dev", "/run")  # kernel and memory file systems: no storage behind them
ANCESTORS = ("environment",)  # sources that also take the folders above their prefixes (iocount.sources_variable)


def _spellings(paths) -> list[str]:
    """Each path as given and resolved (a symlinked folder is opened under either name), without repeats."""
    return list(dict.fromkeys(q for p in paths for q in (os.path.abspath(p), os.path.realpath(p))))


def source_prefixes(run_dir: Path, ckpt_root: Path | None, staged=None) -> dict[str, list[str]]:
    """The prefixes of each I/O source (restart_harness/schema.py IO_SOURCES, each defined in
    docs/measurements.md#io-by-source), for ranks started with this interpreter: the longest prefix matching a path
    decides its source. `staged` (envstage.py Staged, env_stage=): the ranks' environment and extension cache are the
    copy's."""
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                     "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})
    caches = [staged.extensions if staged else extensions_dir(),
              os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton",
              os.environ.get("TORCHINDUCTOR_CACHE_DIR") or f"/tmp/torchinductor_{getpass.getuser()}"]
    prefix = [staged.prefix] if staged else [sys.prefix, sys.exec_prefix]
    interpreter = [staged.python if staged else sys.executable]
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent") / (sysconfig.get_config_var("LDLIBRARY") or "")
    if libpython.is_file() and libpython.suffix != ".a":
        interpreter.append(str(libpython))
    return {
        "environment": _spellings([*prefix, base["stdlib"], base["platstdlib"], *interpreter, SOURCE_ROOT]),
        "extension_cache": _spellings(caches), "checkpoint": _spellings([ckpt_root] if ckpt_root else []),
        "run_dir": _spellings([run_dir]), "system": list(SYSTEM), "pseudo": list(PSEUDO)}


CODE_FOLDERS = ("restart_harness", "engines", "third_party")  # what a rank imports from the checkout


def environment_files_prefixes(run_dir: Path, ckpt_root: Path | None, staged=None) -> list[str]:
    """The folders whose files env_cache= evicts or warms: the environment and extension cache sources, the
    checkout's code folders in place of the whole checkout (its results/ holds runs and their checkpoints)."""
    sources = source_prefixes(run_dir, ckpt_root, staged)
    checkout = set(_spellings([SOURCE_ROOT]))
    env = [p for p in sources["environment"] if p not in checkout]
    return _spellings([*env, *(SOURCE_ROOT / name for name in CODE_FOLDERS)]) + sources["extension_cache"]


def sources_facts(run_dir: Path, ckpt_root: Path | None) -> dict:
    """spec.json's io_sources: each source's prefixes and the file system of its first (mount, type)."""
    def facts(name: str, prefixes: list[str]) -> dict | None:
        fs = filesystem(Path(prefixes[0])) if prefixes and name not in ("system", "pseudo") else None
        return {k: fs.get(k) for k in ("mount", "type")} if fs else None

    return {name: {"prefixes": prefixes, "filesystem": facts(name, prefixes)}
            for name, prefixes in source_prefixes(run_dir, ckpt_root).items()}


def environment(spec: RunSpec, run_dir: Path, record: str, ckpt_root: Path, staged=None) -> dict[str, str]:
    """LD_PRELOAD (libraries first, any existing LD_PRELOAD after them) and the settings that go with them; with a
    staged environment (env_stage=), the copy's extension cache."""
    preload: list[str] = []
    env: dict[str, str] = {"TORCH_EXTENSIONS_DIR": staged.extensions} if staged else {}
    if spec.anatomy or spec.trace:
        try:
            lib = iocount.build()
        except OSError as exc:  # the run goes on; its anatomy says the I/O split is missing and why
            print(f"  [anatomy] no I/O counters: {exc}", file=sys.stderr)
            lib = None
        if lib is not None:
            preload.append(str(lib))
            env[iocount.ENV_PREFIXES] = str(ckpt_root)
            env[iocount.ENV_SOURCES] = iocount.sources_variable(source_prefixes(run_dir, ckpt_root, staged), ANCESTORS)
    if spec.trace:
        tracer = dftracer_compat.preload_library()
        if tracer is not None:  # preflight refuses trace=true without dftracer
            folder = run_dir / "traces" / record
            folder.mkdir(parents=True, exist_ok=True)
            preload.append(str(tracer))
            env.update(dftracer_compat.environment(folder / "trace", ckpt_root))
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    return env
