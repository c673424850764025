"""The README and docs/ tell the truth about their commands and links.

- Every command line in a shell block (```sh or ```bash) of README.md and of
  every page under docs/ runs with --help: a `dqoes ...` line is reduced to the
  sub-command path it names (the words before the first argument) and parsed
  in-process by the same argparse tree the real command uses; a
  `python -m MODULE` line runs `python -m MODULE --help` in a real process; a
  `make TARGET` line names a target of the Makefile; `bash SCRIPT` names a file
  that exists. Other tools' lines (docker, nats-server, curl) are their own.
- Every relative link and image resolves to a file or folder of the checkout,
  and a `#anchor` into a Markdown page to one of its headings.
- The README is at most 150 lines; no table cell of the README or of the
  guide and reference has more than 30 words.
- The generated reference pages are what `python -m tools.refdocs` makes now.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
OWN_PAGES = [REPO / "README.md", REPO / "docs" / "README.md",
             *sorted((REPO / "docs" / "guide").glob("*.md")), *sorted((REPO / "docs" / "reference").glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def shell_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip().rstrip("&").strip()
            if line and not line.startswith("#"):
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


def commands_of(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(kind, argv) for each command line: kind is dqoes, module, make or script."""
    out = []
    for line in shell_lines(text):
        for part in re.split(r"\||&&|;", line):
            try:
                words = shlex.split(part.replace("[", " ").replace("]", " "))
            except ValueError:
                continue
            while words and (words[0] in ("sudo", "env") or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
                words = words[1:]
            if not words:
                continue
            exe = Path(words[0]).name
            if exe == "dqoes":
                out.append(("dqoes", tuple(dqoes_path(words[1:]))))
            elif part.strip().startswith("target "):  # `... | target list`: the same command's sibling
                out.append(("dqoes", tuple(dqoes_path(words))))
            elif exe.startswith("python") and words[1:2] == ["-m"]:
                out.append(("module", (words[2],)))
            elif exe == "make":
                out.append(("make", tuple(words[1:2]) or ("help",)))
            elif exe in ("bash", "sh") and words[1:2] and not words[1].startswith("-"):
                out.append(("script", (words[1],)))
    return out


WHERE: dict[tuple[str, tuple[str, ...]], str] = {}
for _page in PAGES:
    for _c in commands_of(_page.read_text()):
        WHERE.setdefault(_c, rel(_page))
COMMANDS = sorted(WHERE)
README = (REPO / "README.md").read_text()


def test_the_pages_have_commands_of_every_kind():
    kinds = {k for k, _ in COMMANDS}
    assert kinds >= {"dqoes", "module", "make"}, COMMANDS
    assert len(commands_of(README)) >= 10


@pytest.mark.parametrize("kind, argv", COMMANDS, ids=[" ".join([k, *a]) for k, a in COMMANDS])
def test_every_command_line_runs_with_help(kind, argv, capsys):
    where = WHERE[(kind, argv)]
    if kind == "make":
        assert re.search(rf"^{re.escape(argv[0])}:", MAKEFILE, flags=re.M), f"{where}: no make target {argv[0]}"
        return
    if kind == "script":
        assert (REPO / argv[0]).is_file(), f"{where}: no script {argv[0]}"
        return
    if kind == "module":
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", argv[0], "--help"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where}: {done.stderr[-2000:]}"
        assert "usage:" in done.stdout
        return
    assert argv, f"{where}: a `dqoes` line that names no sub-command"
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


def dqoes_lines() -> list[tuple[str, list[str]]]:
    """(page, words after `dqoes`) of every `dqoes` line, written out in full (no [optional] brackets)."""
    out = []
    for page in PAGES:
        for line in shell_lines(page.read_text()):
            for part in re.split(r"\||&&|;", line):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                while words and (words[0] in ("sudo", "env") or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
                    words = words[1:]
                if words and Path(words[0]).name == "dqoes" and "[" not in part:
                    out.append((rel(page), words[1:]))
    return out


DQOES_LINES = dqoes_lines()


@pytest.mark.parametrize("page, words", DQOES_LINES, ids=[f"{p}: {' '.join(w)}" for p, w in DQOES_LINES])
def test_every_dqoes_line_parses_as_written(page, words, capsys):
    """Beyond --help: the line as written has every required argument and valid choices."""
    from services.cli.main import parse

    try:
        parse(words)
    except SystemExit as e:
        assert e.code == 0 and "--help" in words, f"{page}: `dqoes {' '.join(words)}`: {capsys.readouterr().err}"


def test_the_readme_names_every_sub_command():
    shown = {a[0] for k, a in commands_of(README) if k == "dqoes" and a}
    assert shown == set(_subcommands(build_parser())), "the README's commands miss some sub-commands"


def test_the_readme_is_short():
    assert len(README.splitlines()) <= 150


def table_cells(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    cells = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            cells += [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    return cells


@pytest.mark.parametrize("page", OWN_PAGES, ids=rel)
def test_no_table_cell_is_over_30_words(page):
    long = [c for c in table_cells(page.read_text()) if len(c.split()) > 30]
    assert not long, f"{rel(page)}: cells over 30 words: {long}"


def tables(text: str) -> list[list[str]]:
    """Each Markdown table outside code blocks, as its lines."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        row = line.lstrip().startswith("|")
        if row and not previous:
            out.append([])
        if row:
            out[-1].append(line.strip())
        previous = row
    return out


@pytest.mark.parametrize("page", OWN_PAGES, ids=rel)
def test_every_table_row_has_its_headers_cells(page):
    """An unescaped `|` inside a cell (|S|) splits it and shifts the row."""
    bad = []
    for table in tables(page.read_text()):
        widths = [len(re.split(r"(?<!\\)\|", r.strip("|"))) for r in table]
        bad += [r for r, w in zip(table, widths, strict=True) if w != widths[0]]
    assert not bad, f"{rel(page)}: rows whose cell count differs from the header's: {bad}"


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    keep = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return keep.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.M):
        a = anchor(h)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out | set(re.findall(r'<a id="([^"]+)"></a>', text))


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)(?: \"[^\"]*\")?\)", text)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_dead_relative_link(page):
    dead = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(REPO):
            dead.append(target)
            continue
        if not dest.exists():
            dead.append(target)
            continue
        if frag and dest.suffix == ".md" and frag not in anchors(dest):
            dead.append(target)
    assert not dead, f"{rel(page)}: dead links {dead}"


def test_the_generated_reference_is_current():
    done = subprocess.run([sys.executable, "-m", "tools.refdocs", "--check"], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
