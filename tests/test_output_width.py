"""`COLUMNS=80 lumos-sim <every command>`: no output line wider than 80 columns and no word split across
lines, on the bundled example data; every `--help` fits 80 columns; progress off a terminal is plain
lines without `None`.

A split word is found by comparison: the same command at COLUMNS=400 prints every word whole, so a token
of the 80-column output that the wide output lacks, and that joined to the next token of the 80-column
output forms a wide-output token, is a word broken across lines (`nvswitc` + `h`). One-line error
messages (`lumos-sim CMD: error: ...`) are one line by design and are not held to the width."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from conftest import DATA, ROOT
from lumos_sim.cli import build_parser, main as cli_main

_BOX = "│┃─━┏┓┗┛┡┩┠┨┯┷┳┻╇╈┼╋┌┐└┘├┤┬┴╍╌═║╔╗╚╝╟╢╤╧╪╭╮╰╯╷╵╶╴"
CPU = DATA / "cpu_ddp"
HEAVY = DATA / "ddp4" / "heavy"


def _suite(tmp):
    """A one-case accuracy suite on the bundled 2-rank CPU set."""
    path = tmp / "suite.toml"
    path.write_text(f'[suite]\nname = "cpu ddp"\n[[case]]\nname = "cpu_ddp 2 ranks (gloo), trace replay"\n'
                    f'kineto = "{CPU}/device.{{rank}}.json.gz"\net = "{CPU}/host.{{rank}}.json.gz"\n'
                    f'inputs = []\ntolerance = 0.05\n')
    return path


def _commands() -> list[list[str]]:
    """Every sub-command on the bundled data, run from a scratch directory with outputs named relative to
    it, as a user names them: an absolute temporary path (`/tmp/pytest-of-root/pytest-100/...`) grows
    with the run count, and a path longer than the terminal is printed whole on its own line by design."""
    tmp = Path(".")
    job = "job"
    return [
        ["convert", "--kineto", str(CPU / "device.{rank}.json.gz"), "--et", str(CPU / "host.{rank}.json.gz"), "-o", job],
        ["inspect", job],
        ["jsonize", f"{job}.0.et", "-o", str(tmp / "j.json")],
        ["replay", job],
        ["replay", str(HEAVY / "device.{rank}.json.gz"), "--et", str(HEAVY / "host.{rank}.json.gz")],
        ["check", str(_suite(tmp))],
        ["bench", "collective", "--hardware", "h100-sxm", "--op", "all_reduce", "--size", "1GiB", "--gpus", "8"],
        ["bench", "gemm", "--hardware", "h100-sxm", "--m", "8192", "--n", "8192", "--k", "8192"],
        ["bench", "presets"],
        ["list", "hardware"],
        ["list", "models"],
        ["whatif", "list"],
        ["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "64", "--tp", "8", "--seq-len", "8192",
         "--global-batch", "512"],
        ["whatif", "parallelism", "--model", "llama3-8b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64",
         "--search", "--top-k", "2"],
        ["whatif", "trace", str(HEAVY / "device.{rank}.json.gz"), "--et", str(HEAVY / "host.{rank}.json.gz"), "--balance"],
        ["whatif", "failures", "--gpus", "16384", "--strategy", "ft-hsdp", "--trials", "100"],
        ["whatif", "scenario", str(ROOT / "examples" / "scenarios" / "failures_16k.toml")],
        ["whatif", "moe", "--model", "qwen3-235b-a22b", "--routing", "synthetic:tokens=2048", "--ep", "8", "--tokens", "32"],
        ["whatif", "moe", "--model", str(ROOT / "examples" / "moe" / "tiny-moe.toml"),
         "--routing", str(ROOT / "examples" / "routing" / "tiny-moe"), "--ep", "4"],
        ["sweep", str(ROOT / "examples" / "sweeps" / "hardware_generations.toml"), "-o", str(tmp / "hw.parquet"),
         "--set", "model=llama3-8b", "--set", "plan.pp=1", "--set", "plan.vp=1", "--set", "plan.dp=2"],
        ["sweep", str(ROOT / "examples" / "sweeps" / "nic_bandwidth.toml"), "-o", str(tmp / "nic.parquet"), "--dry-run"],
        ["report", str(tmp / "hw.parquet"), "-o", str(tmp / "hw.html")],
        ["calibrate", str(DATA / "h100" / "kernels_norm"), "--hardware", "h100-sxm", "-o", str(tmp / "cal.toml")],
        ["collect", str(ROOT / "examples" / "train_moe.py"), "--routing", "-o", str(tmp / "routing")],
    ]


def _run(args: list[str], columns: int, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    try:
        code = cli_main(args)
    except SystemExit as e:      # --help
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _tokens(text: str) -> list[str]:
    return re.sub(f"[{_BOX}]", " ", text).split()


def split_words(narrow: str, wide: str) -> list[str]:
    """Fragments of `narrow` that join the next token into a token of `wide` (a word broken at a line end)."""
    wide_set = set(_tokens(wide))
    toks = _tokens(narrow)
    return [f"{a}|{b}" for a, b in zip(toks, toks[1:]) if a not in wide_set and a + b in wide_set]


def _width_problems(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 80 and ": error: " not in line]


def test_split_word_detector_finds_a_folded_cell():
    wide = "  nvswitch   Qwen3-235B-A22B  "
    assert split_words("  nvswitc\n  h", wide) == ["nvswitc|h"]
    assert split_words("│ Qwen3-23 │\n│ 5B-A22B │", wide) == ["Qwen3-23|5B-A22B"]
    assert split_words("nvswitch Qwen3-235B-A22B", wide) == []


def test_every_command_fits_80_columns_without_split_words(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LUMOS_SIM_PROGRESS_SECONDS", "1000")   # progress lines are tested below
    monkeypatch.chdir(tmp_path)
    problems = []
    for args in _commands():
        code, out, err = _run(args, 80, monkeypatch, capsys)
        assert code in (0, 2), (args, code, err[-2000:])
        if code == 2:   # only collect without torch: a one-line error
            assert args[0] == "collect" and err.count("\n") == 1 and "torch" in err.lower(), (args, err)
        for line in _width_problems(out + err):
            problems.append(f"{' '.join(args[:3])}: {len(line)} columns: {line}")
        if args[0] in ("convert", "sweep", "calibrate"):   # they write files: the 400-column run would redo it
            continue
        _, wide_out, _ = _run(args, 400, monkeypatch, capsys)
        for pair in split_words(out, wide_out):
            problems.append(f"{' '.join(args[:3])}: split word {pair}")
    assert problems == []


def _parsers(parser: argparse.ArgumentParser, path: list[str]):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + [name])


def test_every_help_fits_80_columns(monkeypatch, capsys):
    problems = []
    for path, _ in _parsers(build_parser(), []):
        _, out, err = _run([*path, "--help"], 80, monkeypatch, capsys)
        assert out.strip(), path
        problems += [f"lumos-sim {' '.join(path)} --help: {line}" for line in (out + err).splitlines() if len(line) > 80]
    assert problems == []


def _early_prose_breaks(text: str, width: int) -> list[str]:
    """Lines of prose (unindented) that continue as a hanging indent (the next line indented four
    spaces: prose wrapped like an example command), or whose paragraph goes on in an unindented line
    whose first word would have fitted after them (broken where its author's source line ended rather
    than at the width)."""
    lines = text.splitlines()
    bad = []
    for line, nxt in zip(lines, lines[1:]):
        prose = line.strip() and not line[0].isspace() and not line.startswith("usage:")
        if not prose or not nxt.strip():
            continue
        hanging = nxt.startswith("    ") and not nxt.startswith("     ")
        early = not nxt[0].isspace() and not line.endswith(":") and len(line) + 1 + len(nxt.split()[0]) <= width
        if hanging or early:
            bad.append(line)
    return bad


def test_help_prose_reflows_as_paragraphs_at_any_width(monkeypatch, capsys):
    # at 80 and 60 columns every paragraph of every --help fills its lines: the description's source line
    # breaks (written for ~100 columns) must not leave a short line mid-paragraph or a hanging indent
    assert _early_prose_breaks("one two\nthree", 80) == ["one two"]       # the detector finds both kinds
    assert _early_prose_breaks("one two\n    three", 80) == ["one two"]
    problems = []
    for columns in (80, 60):
        for path, _ in _parsers(build_parser(), []):
            _, out, _ = _run([*path, "--help"], columns, monkeypatch, capsys)
            problems += [f"COLUMNS={columns} lumos-sim {' '.join(path)} --help: {line!r}"
                         for line in _early_prose_breaks(out, columns - 2)]
    assert problems == []


def test_every_option_has_help_and_enumerated_options_list_their_choices():
    missing = []
    for path, parser in _parsers(build_parser(), []):
        for action in parser._actions:
            if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)):
                continue
            if not action.help and action.help != argparse.SUPPRESS:
                missing.append(f"lumos-sim {' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    parallelism = {tuple(p): q for p, q in _parsers(build_parser(), [])}[("whatif", "parallelism")]
    choices = {a.dest: a.choices for a in parallelism._actions}
    assert list(choices["precision"]) == ["bf16", "fp8"]
    assert list(choices["recompute"]) == ["none", "selective", "full", "op"]
    assert list(choices["zero"]) == [0, 1, 2, 3]


def test_sweep_workers_default_to_the_cpus_and_the_help_says_so(monkeypatch, capsys):
    import os

    _, out, _ = _run(["sweep", "--help"], 80, monkeypatch, capsys)
    cpus = len(os.sched_getaffinity(0))
    assert f"(default: the CPUs this process may use, {cpus} here; never more than the points to run)" \
        in " ".join(out.split())


def test_progress_off_a_terminal_is_plain_lines_without_none(monkeypatch, capsys):
    from lumos_sim.progress import progress_bar

    monkeypatch.setenv("LUMOS_SIM_PROGRESS_SECONDS", "0")
    with progress_bar("sweep (3 points)") as update:
        update(0, None)
        update(1, 3)
        update(3, 3)
    err = capsys.readouterr().err.splitlines()
    assert [re.sub(r", \d+ s$", "", line) for line in err] == [
        "sweep (3 points): 0 done", "sweep (3 points): 1/3 (33%)", "sweep (3 points): 3/3 (100%)"]
    assert all("None" not in line for line in err)


def test_output_width_is_the_terminal_or_columns_or_80(monkeypatch):
    import io

    from lumos_sim.tables import output_width

    monkeypatch.setenv("COLUMNS", "123")
    assert output_width(io.StringIO()) == 123
    monkeypatch.delenv("COLUMNS")
    assert output_width(io.StringIO()) == 80        # piped, no COLUMNS
