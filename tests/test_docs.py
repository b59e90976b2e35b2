"""README.md and docs/ stay true to the CLI.

- every command of `cli/main.py`'s COMMANDS has a docs page naming every one of its options
  (read from the click command objects in-process: no subprocess, no torch import);
- every relative link in README.md and docs/*.md resolves, anchors included, and README links
  every page of docs/;
- README's exit-code table is EXIT_CODES, row for row;
- README's fresh-machine commands are what `.ci/run` runs, and the commands of its first session
  parse as the CLI parses them and name files that exist. (Its `tdbg run` runs for real in
  tests/scenarios/test_readme_session.py, sharing the scenario suite's run of that command.)

Each checker is a function returning what is wrong, and a test feeds it a broken input, so none
of these tests can pass by checking nothing.
"""
import re
import shlex
from pathlib import Path

import click
import pytest

from tdbg.cli.console import EXIT_CODES
from tdbg.cli.main import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# command -> its page under docs/ (replay and diff share the saved-folder page)
DOC_PAGES = {
    "run": "run.md",
    "bisect": "bisect.md",
    "minify": "minify.md",
    "explain": "explain.md",
    "profile": "profile.md",
    "replay": "replay-diff.md",
    "diff": "replay-diff.md",
    "report": "report.md",
    "compare": "compare.md",
    "memory": "memory.md",
}

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _command(name: str) -> click.Command:
    """The command as `tdbg NAME` runs it (the group adds --html to the commands that have it)."""
    return cli.get_command(click.Context(cli), name)


def long_options(command: click.Command) -> list:
    """Every long option spelling of a command (`--check-accuracy` and `--no-check-accuracy`
    both), `--help` left out: click adds it to every command."""
    names = []
    for param in command.params:
        if isinstance(param, click.Option):
            names += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
    return names


def missing_options(command: click.Command, page_text: str) -> list:
    """The long options of `command` that `page_text` never names (`--out` is not named by
    `--outputs`, nor `--check-accuracy` by `--no-check-accuracy`)."""
    return [o for o in long_options(command)
            if not re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", page_text)]


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
    to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set:
    seen, out = {}, set()
    for _, line in prose_lines(text):
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, text: str) -> list:
    """Relative links of a markdown file whose file or #anchor does not exist."""
    bad = []
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):        # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                bad.append(f"{path.name}:{number}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{path.name}:{number}: {target} (no heading #{anchor} in {dest.name})")
    return bad


def section(text: str, heading: str) -> str:
    """The text under `## heading` up to the next heading of level 2 or 1."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"#{1,2} ", lines[i])), len(lines))
    return "\n".join(lines[start:end])


def code_blocks(text: str) -> list:
    """The contents of the fenced code blocks of `text`, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def exit_code_rows(readme_text: str) -> list:
    """(code, name, meaning) of every numbered row of README's exit-code table."""
    rows = []
    for line in section(readme_text, "## Exit codes").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1].strip("`"), cells[2]))
    return rows


def session_commands(readme_text: str) -> list:
    """The commands of README's first session, in order, as (typed, argv): each `$ ...` line of
    its code blocks (typed; the environment assignments and a trailing `; echo ...` dropped), and
    the `tdbg ...` commands the output suggests under `Next:`, `Reproduce:` and `Minify:` (not
    typed; their environment dropped too)."""
    commands = []
    for block in code_blocks(section(readme_text, "## A first session")):
        for line in block.splitlines():
            typed = line.startswith("$ ")
            if not (typed or line.startswith("  ")):
                continue
            try:
                argv = shlex.split(line[2:].split(";")[0] if typed else line)
            except ValueError:      # output prose ("tdbg's compiler"); a typed line must parse
                if typed:
                    raise
                continue
            while argv and re.match(r"[A-Z_][A-Z0-9_]*=", argv[0]):
                argv.pop(0)
            if typed or argv[:1] == ["tdbg"]:
                commands.append((typed, argv))
    return commands


def command_problems(argv: list, outputs: set) -> list:
    """Why a first-session command would not run as README shows it: a usage error (the CLI's own
    parser, in-process), or a file it names that neither exists nor is written by an earlier
    command (`outputs`: the `--out` folders of the commands before it)."""
    if argv[0] == "python":
        path = argv[1]
        ok = (ROOT / path).exists() or Path(path).parts[0] in outputs
        return [] if ok else [f"{' '.join(argv)}: {path} does not exist and no earlier --out writes it"]
    if argv[0] != "tdbg" or len(argv) < 2:
        return [f"{' '.join(argv)}: not a tdbg or python command"]
    command = _command(argv[1])
    if command is None:
        return [f"{' '.join(argv)}: no command {argv[1]!r}"]
    try:
        ctx = command.make_context(f"tdbg {argv[1]}", list(argv[2:]))
    except click.UsageError as e:
        return [f"{' '.join(argv)}: {e.format_message()}"]
    problems = []
    for name in ("script", "target", "path", "folder", "dir_a", "dir_b"):
        value = ctx.params.get(name)
        if value and not (ROOT / value).exists() and Path(value).parts[0] not in outputs:
            problems.append(f"{' '.join(argv)}: {value} does not exist")
    out = next((ctx.params.get(p.name) for p in command.params if "--out" in getattr(p, "opts", ())), None)
    if out:
        outputs.add(Path(out).parts[0])
    return problems


# ---------------------------------------------------------------- (a) options on each page

def test_every_command_has_a_docs_page():
    assert set(DOC_PAGES) == set(COMMANDS)
    for page in DOC_PAGES.values():
        assert (DOCS / page).is_file(), page


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_on_its_commands_page(name):
    command = _command(name)
    assert long_options(command), name       # a command object with no options would check nothing
    text = (DOCS / DOC_PAGES[name]).read_text()
    assert missing_options(command, text) == [], f"docs/{DOC_PAGES[name]} does not name them"


def test_a_missing_option_is_caught():
    command = _command("minify")
    text = (DOCS / "minify.md").read_text()
    assert "--memory-limit" in long_options(command)
    assert missing_options(command, text.replace("--memory-limit", "--memory")) == ["--memory-limit"]
    run = _command("run")
    assert "--no-check-accuracy" in missing_options(run, "--check-accuracy only")
    assert "--out" in missing_options(run, "--outputs, --outdir")


# ---------------------------------------------------------------- (b) links

def test_readme_and_docs_links_resolve():
    bad = []
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        bad += broken_links(path, path.read_text())
    assert bad == []


def test_readme_links_every_docs_page():
    linked = {Path(t.partition("#")[0]).name for _, line in prose_lines(README.read_text())
              for t in LINK.findall(line) if t.startswith("docs/")}
    assert sorted(p.name for p in DOCS.glob("*.md")) == sorted(linked & {p.name for p in DOCS.glob("*.md")})


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## A `--flag` (x)\n[ok](#a---flag-x) [bad](#nope) [gone](other.md)\n"
                    "```\n[in code](ignored.md)\n```\n")
    assert broken_links(page, page.read_text()) == [
        "page.md:3: #nope (no heading #nope in page.md)", "page.md:3: other.md (no such file)"]


# ---------------------------------------------------------------- (c) exit codes

def test_readme_exit_code_table_is_exit_codes():
    text = README.read_text()
    assert exit_code_rows(text) == [(code, name, meaning) for name, (code, meaning) in EXIT_CODES.items()]
    assert "| other |" in section(text, "## Exit codes")


def test_a_wrong_exit_code_row_is_caught():
    text = README.read_text().replace("| 16 | `accuracy` |", "| 61 | `accuracy` |")
    assert exit_code_rows(text) != [(code, name, meaning) for name, (code, meaning) in EXIT_CODES.items()]


# ---------------------------------------------------------------- (d) README's commands

def test_fresh_machine_commands_are_what_ci_runs():
    blocks = [b.strip() for b in code_blocks(section(README.read_text(), "## Fresh machine: two commands"))]
    assert len(blocks) == 2, blocks
    run_cmd, test_cmd = blocks
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [shlex.split(m) for m in re.findall(r"pip install --quiet (.+)", ci)]
    assert installs == [["torch==2.13.0"], ["-e", ".[test]"]]
    assert re.search(r"^python -m pytest( -q)?$", ci, re.M)
    assert test_cmd == "pip install torch==2.13.0 && pip install -e '.[test]' && pytest"
    first, second, tdbg = [shlex.split(part) for part in run_cmd.split("&&")]
    assert first == ["pip", "install", "torch==2.13.0"] and second == ["pip", "install", "-e", "."]
    assert command_problems(tdbg, set()) == []


def test_first_session_commands_parse_and_name_real_files():
    commands = session_commands(README.read_text())
    assert [argv[:2] for typed, argv in commands if typed] == [
        ["tdbg", "run"], ["tdbg", "bisect"], ["tdbg", "minify"], ["python", "foo2/repro.py"]]
    assert len(commands) > 4       # the suggested commands are checked too
    outputs, problems = set(), []
    for _, argv in commands:
        problems += command_problems(argv, outputs)
    assert problems == []


def test_a_bad_session_command_is_caught():
    assert "No such option" in command_problems(["tdbg", "run", "examples/foo2.py", "--bakend", "x"], set())[0]
    assert command_problems(["tdbg", "minify", "examples/nope.py", "--after", "aot"], set()) != []
    assert command_problems(["python", "foo2/repro.py"], set()) != []
    assert command_problems(["python", "foo2/repro.py"], {"foo2"}) == []
