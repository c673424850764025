"""The README tells the truth about its commands: every command line in it runs with --help.

Each `dqoes ...`, `python -m services....` and `make ...` line in the README's
shell blocks is reduced to the command it names (the sub-command path before
the first argument) and run with --help in-process, which parses the same
argparse tree the real command does; a make target must exist in the Makefile.
Lines for other tools (docker, nats-server, sudo's prefix) are the tools' own.
The Commands section must list every `dqoes` sub-command.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from services.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()


def shell_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", README, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip().rstrip("&").strip()
            if line:
                lines.append(line)
    return lines


def _subcommands(parser) -> dict:
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            return action.choices
    return {}


def dqoes_path(words: list[str]) -> list[str]:
    """The sub-command path of `dqoes w1 w2 ...`: as far as the words name sub-commands."""
    path, parser = [], build_parser()
    for w in words:
        choices = _subcommands(parser)
        if w not in choices:
            break
        path.append(w)
        parser = choices[w]
    return path


def commands() -> list[tuple[str, list[str]]]:
    """(kind, argv) for each command line: kind is dqoes, module or make."""
    out = []
    for line in shell_lines():
        for part in line.split("|"):
            words = shlex.split(part.replace("[", " ").replace("]", " "))
            if words and words[0] == "sudo":
                words = words[1:]
            if not words:
                continue
            exe = Path(words[0]).name
            if exe == "dqoes":
                out.append(("dqoes", dqoes_path(words[1:])))
            elif part.strip().startswith("target "):  # `... | target list`: the same command's sibling
                out.append(("dqoes", dqoes_path(words)))
            elif exe.startswith("python") and words[1:2] == ["-m"]:
                out.append(("module", [words[2]]))
            elif exe == "make":
                out.append(("make", words[1:2]))
    return out


COMMANDS = commands()


def test_the_readme_has_commands_of_every_kind():
    kinds = {k for k, _ in COMMANDS}
    assert kinds == {"dqoes", "module", "make"}, COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("kind, argv", COMMANDS, ids=[" ".join([k, *a]) for k, a in COMMANDS])
def test_every_readme_command_runs_with_help(kind, argv, capsys):
    if kind == "make":
        assert re.search(rf"^{re.escape(argv[0])}:", MAKEFILE, flags=re.M), f"no make target {argv[0]}"
        return
    if kind == "dqoes":
        assert argv, "a `dqoes` line that names no sub-command"
        run = build_parser().parse_args
    else:
        import importlib

        run = importlib.import_module(f"{argv[0]}.__main__").parse
        argv = []
    with pytest.raises(SystemExit) as e:
        run([*argv, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_commands_section_lists_every_sub_command():
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = {path[0] for kind, path in commands() if kind == "dqoes" and path and f"dqoes {path[0]}" in section}
    assert listed == set(_subcommands(build_parser())), "the Commands section misses some sub-commands"
    nested = {f"{a} {b}" for a, p in _subcommands(build_parser()).items() for b in _subcommands(p)}
    shown = {" ".join(path[:2]) for kind, path in commands() if kind == "dqoes" and len(path) >= 2}
    assert nested <= shown, f"not in the README: {sorted(nested - shown)}"


def test_the_demo_output_in_the_readme_is_the_demos_format():
    block = README.split("`make demo` starts two deployments", 1)[1].split("```", 2)[1]
    assert re.search(r"^t = +\d+ s +dqoes: met +\d+, in band +\d+ \([\d/]+\), CPU +[\d.]+ +\| +default: met +\d+",
                     block, re.M)
    assert re.search(r"^  DQoES / default Swarm: met [\d.]+x, in band [\d.]+x$", block, re.M)
