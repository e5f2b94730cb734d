"""The project's shape: no import cycle between its modules (imports inside functions count too), every key
declared once and explained by --help with its default, no sys.path or PYTHONPATH edits, ruff clean."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, submit

from engines import registry
from restart_harness.command import parse_args
from restart_harness.command.options import BaselineOptions, PlanOptions, RestartOptions
from restart_harness.launchers import all_launchers
from restart_harness.spec.keys import keys_of
from restart_harness.spec.model_shape import shape_keys
from restart_harness.spec.runspec import run_keys
from restart_harness.stacks import all_stacks
from restart_harness.targets import all_targets

PACKAGES = ("restart_harness", "engines", "analysis", "third_party", "configs", "testbeds")


def project_modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the project modules it imports anywhere in its body (a package's __init__ counts as importing
    nothing of its own children)."""
    modules = project_modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 40 and graph["restart_harness.cli"]  # the scan sees the project
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]




# The layers, from the ground up (docs/architecture.md "Layers"): a unit imports units of the layers below it only,
# imports inside functions included. A unit is a folder or a module of restart_harness/, or a top-level package.
LAYERS = (
    ("errors", "faults", "plugins", "rank_env", "schema", "files", "third_party", "configs"),
    ("iocount", "spec", "envstage"),
    ("plan",),
    ("launchers", "targets"),
    ("engines", "model"),
    ("stacks",),
    ("resolve",),
    ("machine", "nodecheck", "worker", "command"),
    ("rundir",),
    ("results",),
    ("predict", "analysis"),
    ("preflight",),
    ("phases",),
    ("campaigns",),
    ("cli",),
    ("testbeds",),  # test servers: nothing of the harness imports them
)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "restart_harness" and len(parts) > 1 else parts[0]


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that does not run down the layers (or names a unit no layer holds)."""
    layer = {unit: n for n, units in enumerate(LAYERS) for unit in units}
    found = []
    for module, imported in sorted(graph.items()):
        here = unit_of(module)
        if module == "restart_harness":
            continue
        if here not in layer:
            found.append(f"{module}: its unit {here!r} is in no layer (tests/test_structure.py LAYERS)")
            continue
        for target in sorted(imported):
            there = unit_of(target)
            if target == "restart_harness" or there == here:
                continue
            if layer.get(there, len(LAYERS)) >= layer[here]:
                found.append(f"{module} imports {target}: {there} is not below {here}")
    return found


def test_every_import_runs_down_the_layers():
    """Package by package, lazy imports included: no unit imports one beside or above it (so no package cycle)."""
    assert layering_violations(import_graph()) == []


def test_a_planted_upward_import_is_found(tmp_path):
    """The layering check fails on an import inside a function, from the ground floor to the orchestration."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    atomic = tmp_path / "restart_harness" / "files" / "atomic.py"
    atomic.write_text(atomic.read_text() + "\n\ndef planted():\n    from restart_harness.phases import run\n")
    found = layering_violations(import_graph(tmp_path))
    assert found and all(v.startswith("restart_harness.files.atomic imports restart_harness.phases") for v in found)
    assert "phases is not below files" in found[0]


def test_the_docs_show_the_layers():
    """docs/architecture.md lists the layers this test holds the code to."""
    text = (REPO / "docs" / "architecture.md").read_text()
    shown = " < ".join(", ".join(units) for units in LAYERS)
    assert shown in " ".join(text.replace("`", "").split()), shown


# The registries are asked for a plug-in by its name in one module: everything else is handed the objects.
LOOKUP = re.compile(r"\b(registry|launchers|stacks|targets)\.(get|select|recorded|for_location|of|for_spec|for_run)\("
                    r"|all_(stacks|launchers|targets|engines)\(\)\[")
LOOKUPS_IN = {"restart_harness/resolve.py": 8, "restart_harness/stacks/__init__.py": 1,
              "restart_harness/targets/__init__.py": 1, "engines/registry.py": 1}  # the registries' own get()


def test_plug_ins_are_looked_up_by_name_only_where_the_run_is_resolved():
    found = {}
    for path in project_modules().values():
        rel = path.relative_to(REPO).as_posix()
        if n := len(LOOKUP.findall(path.read_text())):
            found[rel] = n
    assert found == LOOKUPS_IN


def test_configurations_are_declared_with_the_keys_and_recorded():
    """Which spec fields make a configuration is declared with each key (config=); spec.json records the list, and
    every field of the runs that predate the record is still one."""
    from restart_harness.schema import CONFIG_FIELDS_UNRECORDED, config_fields
    from restart_harness.spec.runspec import configuration_fields

    spec = parse_args(["tiny"]).to_json()
    assert config_fields(spec) == tuple(configuration_fields())
    assert set(CONFIG_FIELDS_UNRECORDED) <= set(configuration_fields())
    assert {"seed", "results_dir", "master_port", "timeout"}.isdisjoint(configuration_fields())


def test_every_key_is_declared_once():
    groups = {"run": run_keys(), "model": shape_keys(), "plan": keys_of(PlanOptions),
              "baseline": keys_of(BaselineOptions), "restart": keys_of(RestartOptions)}
    seen: dict[str, str] = {}
    for where, keys in groups.items():
        for name in keys:
            assert name not in seen, f"{name} declared by {seen.get(name)} and {where}"
            seen[name] = where
    for engine, cls in registry.all_engines().items():
        for name in keys_of(cls.Options):
            assert name not in seen, f"engine {engine} option {name} shadows the {seen.get(name)} key"


def test_help_explains_every_key_with_its_default(tmp_path):
    proc = submit(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for keys in (run_keys(), shape_keys(), keys_of(PlanOptions), keys_of(BaselineOptions), keys_of(RestartOptions)):
        for name, k in keys.items():
            line = next((x for x in text.splitlines() if x.strip().startswith(f"{name}=")), None)
            assert line and "default " in line and k.help in line, name
    for name, cls in registry.all_engines().items():
        assert f"  {name}: {cls.description}" in text
    for group in ("model keys", "layout keys", "training keys", "checkpoint keys", "launch keys", "cluster keys",
                  "output keys", "plan keys", "baseline keys", "restart keys"):
        assert f"{group}" in text


@pytest.mark.parametrize("needle", ["sys.path.insert", "sys.path.append", "PYTHONPATH"])
def test_no_path_edits_in_the_project(needle):
    sources = [*project_modules().values(), *(REPO / "benchmarks").glob("*.py")]  # benchmarks: python -m benchmarks.X
    offenders = [str(p.relative_to(REPO)) for p in sources if needle in p.read_text()]
    offenders += [s for s in ("config-n-run.py", "submit-job.sh", "run-tests.sh") if needle in (REPO / s).read_text()]
    assert offenders == []


def test_ruff_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPO)], capture_output=True,
                          text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_docs_keys_page_is_generated_from_the_declarations():
    from restart_harness.command.help import markdown

    assert (REPO / "docs" / "keys.md").read_text() == markdown(), \
        "docs/keys.md is stale: python -m restart_harness.command.help > docs/keys.md"


TIME_WORDS = re.compile(r"(?i)(wall|elapsed|duration|took|perf_counter|monotonic|time\(\)|seconds)")
BOUNDS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def wall_clock_bounds(source: str) -> list[int]:
    """Lines of `assert`s that bound a time by a number (`wall < 2.0`, `seconds <= x + 0.01`): how long something
    took on this machine at this moment, which a busy machine breaks. Comparing two figures (blocking <= durable), a
    time with 0, or within the rounding of recorded figures (below 1e-4 s) is not a bound."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            if not any(isinstance(op, BOUNDS) for op in compare.ops):
                continue
            operands = [compare.left, *compare.comparators]
            numbers = [c.value for o in operands for c in ast.walk(o)
                       if isinstance(c, ast.Constant) and type(c.value) in (int, float) and abs(c.value) >= 1e-4]
            if numbers and any(TIME_WORDS.search(ast.unparse(o)) for o in operands):
                lines.append(node.lineno)
    return lines


def test_no_wall_clock_assertions_in_tests():
    """Speed is a benchmark's job (benchmarks/, docs/benchmarks.md), never a test's: CI runs on busy machines."""
    offenders = {p.name: wall_clock_bounds(p.read_text()) for p in (REPO / "tests").glob("*.py")}
    assert {name: lines for name, lines in offenders.items() if lines} == {}


def test_the_wall_clock_rule_finds_a_bound():
    assert wall_clock_bounds("assert wall < 2.0\nassert a['seconds'] <= b + 0.01\n") == [1, 2]
    assert wall_clock_bounds("assert 0 < blocking_seconds <= durable_seconds\nassert n < 2\n") == []


# Each plug-in is split by audience (as engines/base.py splits an engine): every view is small enough to read whole.
MAX_VIEW_MEMBERS = 12


def members(cls: type) -> set[str]:
    """A view's public members: methods, properties and class attributes (given a value or only annotated) declared
    on it or inherited from its bases (instance attributes set in __init__ are its state, not its interface)."""
    names = (n for klass in cls.__mro__ if klass is not object
             for n in (*vars(klass), *vars(klass).get("__annotations__", {})))
    return {n for n in names if not n.startswith("_")}


def plug_in_views() -> dict[str, type]:
    """Every view of every target, stack and launcher: the interfaces (the base classes) and each plug-in's own."""
    from restart_harness.launchers.base import Launcher, Scheduler
    from restart_harness.stacks.base import Rank, Stack
    from restart_harness.targets.base import StorageProbe, Store, Stored, Target

    views: list[type] = [Target, Stored, Store, StorageProbe, Stack, Rank, Launcher, Scheduler]
    for target in all_targets().values():
        views += [target, target.Stored, target.Stored.Store]
    views += StorageProbe.__subclasses__()  # each target's (its module is imported with it)
    for stack in all_stacks().values():
        views += [stack, stack.Rank]
    for launcher in all_launchers().values():
        views += [launcher, *([launcher.scheduler] if launcher.scheduler else [])]
    return {f"{v.__module__}.{v.__qualname__}": v for v in views}


def oversized(views: dict[str, type]) -> dict[str, int]:
    return {name: len(members(v)) for name, v in views.items() if len(members(v)) > MAX_VIEW_MEMBERS}


def test_every_view_of_a_plug_in_has_at_most_twelve_members():
    views = plug_in_views()
    assert len(views) >= 8 + 2 * 4 + 3 * 2 + 6
    assert oversized(views) == {}


def test_the_view_rule_finds_a_view_too_large():
    from restart_harness.stacks.base import Rank

    class Grown(Rank):  # the rank-side view and one method more
        def extra(self) -> None:
            pass

    assert len(members(Rank)) == MAX_VIEW_MEMBERS and oversized({"planted": Grown}) == {"planted": 13}


# Code that asks which storage target, training stack or engine it runs with, by its name: the questions only the
# plug-ins answer (their declared capabilities). "none" and "default" are also words of the keys' values.
PLUG_INS = "|".join(sorted({*all_stacks(), *all_targets(), "posix", "object", *registry.all_engines()} -
                           {"none", "default"}))
BRANCH = re.compile(rf"""is_s3\b|checkpoint_url|["']s3://|\bstack\s*(==|!=)|(==|!=)\s*["']({PLUG_INS})["']"""
                    rf"""|["']({PLUG_INS})["']\s+(not\s+)?in\b|\bin\s*[(\[{{]\s*["']({PLUG_INS})["']""")
ANSWERED_IN = ("restart_harness/targets/", "restart_harness/stacks/", "restart_harness/spec/",
               "restart_harness/files/")
# restart_harness/schema.py reads runs of harness 0.2.0, whose spec.json names no storage target (an s3:// ckpt_dir was S3);
# engines/_datastates_api.py looks for the DataStates library's own folder, `datastates`
ALLOWED_LINES = {"restart_harness/schema.py": 1, "engines/_datastates_api.py": 1}


def test_storage_targets_and_stacks_are_asked_of_their_plug_ins_only():
    """A new target or stack is one file: nothing outside targets/ and stacks/ branches on which one runs."""
    found = {}
    for path in project_modules().values():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(ANSWERED_IN):
            continue
        lines = [n for n, line in enumerate(path.read_text().splitlines(), 1)
                 if BRANCH.search(line.split("#")[0])]
        if len(lines) > ALLOWED_LINES.get(rel, 0):
            found[rel] = lines
    assert found == {}


def test_the_branch_rule_finds_a_membership_test():
    for line in ('if "deepspeed" not in cls.stacks:', "ok = 'fsdp2' in c.stacks", 'if name in ("lazy", "dcp"):',
                 'if target.kind == "posix":', "if spec.stack != 'fsdp2':"):
        assert BRANCH.search(line), line
    assert not BRANCH.search("if stack.accepts_engine(cls):") and not BRANCH.search('if text in ("none", "auto"):')


# Code that asks which launcher starts the ranks: the question only launchers/ answers.
LAUNCHERS = "|".join(n for c in all_launchers().values() for n in (c.name, *c.aliases))
LAUNCHER_BRANCH = re.compile(rf"""\blauncher\s*(==|!=|\bin\b|\bnot\s+in\b)|(==|!=)\s*["']({LAUNCHERS})["']"""
                             rf"""|\bin\s*[(\[{{]\s*["']({LAUNCHERS})["']""")


def test_launchers_are_asked_of_their_plug_ins_only():
    """A new launcher is one file: nothing outside launchers/ branches on which one starts the ranks."""
    found = {}
    for path in project_modules().values():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith("restart_harness/launchers/"):
            continue
        lines = [n for n, line in enumerate(path.read_text().splitlines(), 1)
                 if LAUNCHER_BRANCH.search(line.split("#")[0])]
        if lines:
            found[rel] = lines
    assert found == {}


def test_the_launcher_rule_finds_a_branch():
    for line in ('if spec.launcher == "slurm":', 'x = spec.launcher in ("local", "torchrun")',
                 "if launcher != 'pbs':", 'ok = name in ["mpiexec", "x"]', "if spec.launcher not in SUBMIT:"):
        assert LAUNCHER_BRANCH.search(line), line
    assert not LAUNCHER_BRANCH.search("launcher = launchers.of(spec)")


@pytest.mark.parametrize("workers", ["x", "-1", "2 -p evil"])
def test_run_tests_refuses_a_bad_worker_count_before_installing_anything(workers, tmp_path):
    env = {**os.environ, "RH_TEST_WORKERS": workers, "RH_VENV_DIR": str(tmp_path / "venv")}
    proc = subprocess.run([str(REPO / "run-tests.sh")], capture_output=True, text=True, env=env, check=False,
                          timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"RH_TEST_WORKERS={workers}: not a number of workers; accepted: 0 (no workers) or a count " \
                          "such as 2\n"
    assert not (tmp_path / "venv").exists()


def test_the_durations_file_says_how_busy_the_machine_and_its_host_were(tmp_path):
    """The whole machine's CPU-seconds over a session (/proc/stat), steal included: the same code measured 17 and
    21 minutes an hour apart on a host that was quiet, then busy (docs/testing.md), so a run's minutes come with
    them; scripts/test_durations.py prints them."""
    import durations

    before = durations.machine_counters()
    spent = time.process_time() + 0.3
    while time.process_time() < spent:  # 0.3 CPU-seconds of this process: the machine was at least that busy
        pass
    seen = durations.machine_seconds(before, durations.machine_counters())
    assert set(seen) == {"busy", "idle", "iowait", "steal"} and seen["busy"] >= 0.2, seen
    assert durations.machine_seconds(None, before) is None
    data = {"commit": "abc", "cpus": 2, "args": [], "pytest_wall_seconds": 10.0, "tests": [],
            "machine_cpu_seconds": {"busy": 1900.0, "idle": 280.0, "iowait": 26.0, "steal": 6.0}}
    (tmp_path / "d.json").write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "test_durations.py"), str(tmp_path / "d.json")],
                         capture_output=True, text=True, check=True).stdout
    assert "machine during pytest: busy 1,900 CPU-s, idle 280, iowait 26, steal 6" in out, out


# A module path the docs name (`restart_harness/x.py`, or `worker/x.py` inside restart_harness/), other than the
# dependencies' own files (deepspeed/runtime/engine.py), is a file of this checkout.
DOC_PATH = re.compile(r"(?<![\w./-])((?:[a-z_0-9]+/)+[a-z_0-9]+\.py)\b")
NOT_OURS = ("deepspeed/", "torch/")


def test_every_module_path_in_the_docs_exists():
    stale = [f"{doc.relative_to(REPO)}:{n} {path}" for doc in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]
             for n, line in enumerate(doc.read_text().splitlines(), 1) for path in DOC_PATH.findall(line)
             if not path.startswith(NOT_OURS) and not any((REPO / base / path).is_file()
                                                          for base in ("", "restart_harness"))]
    assert stale == []
