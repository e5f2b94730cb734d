"""The newcomer's stumbles of issue 68, as a table in the shape of tests/test_bad_input.py: each refusal exits 2 with
one line naming the value and what is accepted, no traceback, nothing created; what the refusal and the help say is
what the parser accepts (every yes/no key's spellings, one rule for GB and GiB, every command's own --help)."""

from __future__ import annotations

import pytest
from refusals import made, refused, tree, typed

from engines import registry
from restart_harness.command.help import TOPICS
from restart_harness.errors import UsageError
from restart_harness.spec.keys import FALSE, SIZE_MAX, TRUE, UNITS, coerce, keys_of, parse_size
from restart_harness.spec.runspec import run_keys

BOOL = "accepted values are true, false (also 1, 0, yes, no, on, off)"
SIZE = "expected a size in bytes (4096, 64M or 64MiB = 64 x 2^20, 10GB = 10 x 10^9)"
# where each engine's options are typed (an engine of another stack needs that stack)
ENGINE_RUN = {"dcp": ["tiny", "stack=fsdp2", "engine=dcp"]}


def _bool_rows() -> dict:
    rows = {f"{k}=maybe": (["tiny", f"{k}=maybe"], f"{k}=maybe: {BOOL}")
            for k, key in run_keys().items() if key.type is bool}
    for name, cls in registry.all_engines().items():
        for k, key in keys_of(cls.Options).items():
            if key.type is bool:
                rows[f"engine={name} {k}=maybe"] = ([*ENGINE_RUN.get(name, ["tiny", f"engine={name}"]), f"{k}=nope"],
                                                    f"{k}=nope: {BOOL}")
    rows |= {
        "matrix keep=2": (["matrix", "keep=2"], f"keep=2: {BOOL}"),
        "clean apply=y": (["clean", "apply=y"], f"apply=y: {BOOL}"),
        "study reference=oui": (["study", "reference=oui"], f"reference=oui: {BOOL}"),
        "the older plan= spelling": (["tiny", "plan=maybe"], ("plan=maybe: accepted values are true, json, false (also "
                                                              "1, 0, yes, no, on, off)")),
        "a yes/no key in a sweep list": (["tiny", "keep=true,sometimes"], f"keep=sometimes: {BOOL}"),
    }
    return rows


SIZE_CASES = {
    "a fraction of GB": (["study", "disk=1.5GB"], f"disk=1.5GB: {SIZE}"),
    "a space before the unit": (["study", "disk=10 GB"], f"disk=10 GB: {SIZE}"),
    "petabytes": (["study", "disk=1PB"], f"disk=1PB: {SIZE}"),
    "a rate for a size": (["study", "disk=10GB/s"], f"disk=10GB/s: {SIZE}"),
    "a unit without a number": (["study", "disk=GB"], f"disk=GB: {SIZE}"),
    "a negative size": (["study", "disk=-1G"], f"disk=-1G: {SIZE}"),
    "zero GB": (["study", "disk=0GB"], "disk=0GB: must be a positive integer"),
    "TB is 10^12: 1126TB is over a PiB": (["study", "disk=1126TB"], f"disk=1126TB: must be at most {SIZE_MAX:,}"),
    "1025 TiB is over a PiB": (["study", "disk=1025TiB"], f"disk=1025TiB: must be at most {SIZE_MAX:,}"),
    "scientific notation": (["baseline", "dir={tmp}/empty", "file_bytes=1e6"], f"file_bytes=1e6: {SIZE}"),
    "bits": (["baseline", "dir={tmp}/empty", "file_bytes=64Mbit"], f"file_bytes=64Mbit: {SIZE}"),
    "a decimal comma": (["baseline", "dir={tmp}/empty", "file_bytes=1,5G"], "file_bytes=1,5G"),
    "a fraction of GiB to clean": (["clean", "larger_than=0.5GiB"], f"larger_than=0.5GiB: {SIZE}"),
    "an unknown unit to clean": (["clean", "larger_than=3GG"], f"larger_than=3GG: {SIZE}"),
    "a crossover end in exa": (["predict", "tiny", "crossover_max_bytes=1E"], f"crossover_max_bytes=1E: {SIZE}"),
    "a crossover start in float": (["predict", "tiny", "crossover_min_bytes=1.0M"],
                                   f"crossover_min_bytes=1.0M: {SIZE}"),
    "a crossover end past a PiB in TB": (["predict", "tiny", "crossover_max_bytes=2000TB"],
                                         f"crossover_max_bytes=2000TB: must be at most {SIZE_MAX:,}"),
}

HELP_CASES = {
    "an unknown command's --help": (["nosuch", "--help"], "nosuch --help: neither a command nor a MODEL; commands: "
                                                          + ", ".join(TOPICS)),
    "an unknown command's -h": (["sweeps", "-h"], "sweeps --help: neither a command nor a MODEL; commands: run, sweep"),
    "help of an unknown command": (["help", "nosuch"], "help nosuch: no such command; commands: " + ", ".join(TOPICS)),
    "help of a model": (["help", "tiny"], "help tiny: no such command; commands: run, sweep"),
    "a long word's --help": (["x" * 2000, "--help"], "a first argument of 2,000 characters --help"),
    "a missing preset file's --help": (["/nonexistent/m.yaml", "--help"], "/nonexistent/m.yaml --help: neither"),
}

CASES = {**_bool_rows(), **SIZE_CASES, **HELP_CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_refused(name, tmp_path, monkeypatch, capsys):
    tokens, named = CASES[name]
    before = tree(made(tmp_path))
    code, err = typed(tokens, tmp_path, monkeypatch, capsys)
    refused(code, err, named, before, tree(tmp_path))


@pytest.mark.parametrize("word", TRUE + FALSE + ("TRUE", "Off", "YES"))
def test_every_spelling_the_refusal_lists_is_accepted(word):
    assert coerce(run_keys()["keep"], word) is (word.lower() in TRUE)
    assert word.lower() in BOOL


@pytest.mark.parametrize("text, size", [
    ("4096", 4096), ("64K", 64 << 10), ("64k", 64 << 10), ("64KiB", 64 << 10), ("64KB", 64_000), ("64kb", 64_000),
    ("64M", 64 << 20), ("64MiB", 64 << 20), ("64MB", 64_000_000), ("10G", 10 << 30), ("10GiB", 10 << 30),
    ("10gib", 10 << 30), ("10Gi", 10 << 30), ("10GB", 10 * 10**9), ("10gb", 10 * 10**9), ("1T", 1 << 40),
    ("1TiB", 1 << 40), ("1TB", 10**12), ("1024TiB", SIZE_MAX), ("1125TB", 1125 * 10**12),
])
def test_sizes_read_gb_as_ten_to_the_ninth_and_gib_as_two_to_the_thirtieth(text, size):
    assert parse_size("disk", text) == size
    assert coerce(keys_of(_study())["disk"], text) == size


def _study():
    from restart_harness.command.options import StudyOptions

    return StudyOptions


def test_the_unit_rule_is_stated_once_in_help_and_docs(capsys):
    from restart_harness.cli import main

    assert "GB = 10^9 bytes, GiB = 2^30 bytes" in UNITS
    assert main(["--help"]) == 0
    assert f"units: {UNITS}" in capsys.readouterr().out
    from conftest import REPO

    assert f"Units: {UNITS}." in (REPO / "docs" / "keys.md").read_text()
    # every size or memory key says which: bytes, GiB, MiB, or GB/s = 10^9 (none a bare "GB")
    for cls in [*(c.Options for c in registry.all_engines().values())]:
        assert all(k.unit != "GB" for k in keys_of(cls).values()), cls


# each command's own help: its usage line, not the others'
OWN = {"run": "./submit-job.sh [run] MODEL", "sweep": "./submit-job.sh MODEL key=a,b"}


@pytest.mark.parametrize("argv", [[t, "--help"] for t in TOPICS] + [[t, "-h"] for t in TOPICS]
                         + [["help", t] for t in TOPICS] + [["tiny", "--help"], ["tiny", "tp=1,2", "--help"]])
def test_every_command_has_its_own_help(argv, capsys):
    from restart_harness.cli import main

    topic = {"tiny": "sweep" if "tp=1,2" in argv else "run"}.get(argv[0], argv[0])
    topic = argv[1] if argv[0] == "help" else topic
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("usage: ./submit-job.sh "), err
    own = OWN.get(topic, f"./submit-job.sh {topic} ")
    assert own in out.splitlines()[0], out[:300]
    others = [OWN.get(t, f"./submit-job.sh {t} ") for t in TOPICS if t != topic]
    assert not [o for o in others if o in out.split("\n\n")[0]], out.split("\n\n")[0]
    if topic not in ("run", "sweep"):
        assert f"{topic} keys:" in out


def test_a_refusal_never_says_an_accepted_spelling_is_refused():
    """What the yes/no refusal lists, the parser takes; what it does not list, the parser refuses."""
    key = run_keys()["keep"]
    for word in ("y", "n", "t", "f", "enable", "2"):
        with pytest.raises(UsageError, match="also 1, 0, yes, no, on, off"):
            coerce(key, word)
