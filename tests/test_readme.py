"""The READMEs' snippets run on their own: each ```python block of README.md and README.zh-CN.md
in a fresh namespace (imports included), as a reader pastes one; the Chinese README's code
blocks are README.md's, character for character; and the generated results blocks are where
their commands write them: the headline table in both READMEs, the full tables on the docs'
results pages (docs/lab-results.md, docs/real-model.md)."""

from __future__ import annotations

import re
import shlex
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
READMES = (ROOT / "README.md", ROOT / "README.zh-CN.md")
LAB_RESULTS, REAL_MODEL = ROOT / "docs" / "lab-results.md", ROOT / "docs" / "real-model.md"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def code_blocks(path: Path, language: str | None = None) -> list[tuple[int, str, str]]:
    """``(first line number, language, code)`` of each fenced block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
        if language is None or m.group(1) == language
    ]


SNIPPETS = [(path, line, code) for path in READMES for line, _, code in code_blocks(path, "python")]


@pytest.mark.parametrize(
    ("path", "line", "code"), SNIPPETS, ids=[f"{p.name}:{line}" for p, line, _ in SNIPPETS]
)
def test_readme_snippet_runs_alone(
    path: Path, line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict[str, object] = {"__name__": f"readme_{line}"}  # nothing from another block
    try:
        exec(compile(textwrap.dedent(code), f"{path.name}:{line}", "exec"), namespace)
    except Exception as e:
        raise AssertionError(f"{path.name} line {line} does not run on its own: {e!r}") from e


#: The pages whose ```bash ``posenc`` commands are parsed by the CLI (the READMEs', which take
#: minutes to hours to run, and those of the pages their results and set-up moved to).
COMMAND_PAGES = (*READMES, LAB_RESULTS, REAL_MODEL, ROOT / "docs" / "install.md",
                 ROOT / "docs" / "extend.md")  # fmt: skip


def posenc_commands(path: Path) -> list[list[str]]:
    """The arguments of each ``posenc`` line of a page's ```bash blocks (after the comment)."""
    lines = [line for _, lang, code in code_blocks(path) if lang == "bash"
             for line in code.replace("\\\n", " ").splitlines()]  # fmt: skip
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith("posenc ")]


def parse_command(argv: list[str]) -> list[str]:
    """The subcommand path of ``posenc ARGV`` once the CLI has parsed every option and argument
    (names, types, choices) as a run would, without running anything; ValueError with the usage
    error the CLI would print."""
    from typer.main import get_command

    from posenc.cli import app

    cmd = get_command(app)
    path: list[str] = []
    try:
        ctx = cmd.make_context("posenc", list(argv))
        while hasattr(cmd, "resolve_command") and (rest := [*ctx._protected_args, *ctx.args]):
            name, cmd, rest = cmd.resolve_command(ctx, rest)
            path.append(name)
            ctx = cmd.make_context(name, rest, parent=ctx)
    except Exception as e:  # the CLI's usage errors (typer's own copy of click's classes)
        raise ValueError(getattr(e, "format_message", e.__str__)()) from e
    return path


def test_command_parser_refuses_what_the_cli_refuses() -> None:
    assert parse_command(["extend", "smollm2", "--dry-run"]) == ["extend", "run"]
    assert parse_command(["lab", "report", "--readme", "README.md"]) == ["lab", "report"]
    for bad in (["lab", "--seeds", "x"], ["extend", "smollm2", "--bogus"], ["nothere"]):
        with pytest.raises(ValueError, match=r"Invalid value|No such option|No such command"):
            parse_command(bad)


@pytest.mark.parametrize("path", COMMAND_PAGES, ids=lambda p: p.name)
def test_readme_commands_parse(path: Path) -> None:
    """Every ``posenc`` command the READMEs and the moved pages show is one the CLI takes, with
    options it knows and values of their types (running them takes minutes to hours: the study
    behind docs/real-model.md took two)."""
    commands = posenc_commands(path)
    if path in READMES:
        assert len(commands) >= 3, path.name  # posenc extend: dry run, study, report
    for argv in commands:
        try:
            parse_command(argv)
        except ValueError as e:
            raise AssertionError(f"{path.name}: posenc {shlex.join(argv)}: {e}") from e


def test_readmes_have_python_snippets() -> None:
    assert all(code_blocks(path, "python") for path in READMES)


def test_chinese_readme_code_is_the_english_readmes() -> None:
    english = [(lang, code) for _, lang, code in code_blocks(READMES[0])]
    chinese = [(lang, code) for _, lang, code in code_blocks(READMES[1])]
    assert chinese == english


def test_readme_images_exist() -> None:
    """Every image the READMEs and the results pages show is a committed PNG (the figures under
    docs/results, written by `posenc plot ...` / `posenc extend report --figure` from the runs the
    tables come from)."""
    for path in (*READMES, LAB_RESULTS, REAL_MODEL):
        for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", path.read_text(encoding="utf-8")):
            image = path.parent / target
            assert image.is_file(), f"{path.name} shows {target}, which does not exist"
            assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", target


GENERATED_BLOCK = re.compile(r"^<!-- ((?:lab|extend):[\w-]+) -->\n(.*?)^<!-- /\1 -->$", re.M | re.S)


def generated_blocks(path: Path) -> dict[str, str]:
    """The blocks ``posenc lab report --readme FILE`` (and ``posenc extend report RUN --readme
    FILE``) write: ``{"lab:table": text, ...}``."""
    return {m[1]: m[2] for m in GENERATED_BLOCK.finditer(path.read_text(encoding="utf-8"))}


def test_generated_blocks_found() -> None:
    """The README holds the lab's headline and the real models' task summary; the four lab
    tables are on the lab's results page and the real-model study on its own page, where their
    commands write them."""
    pages = {READMES[0]: {"lab:headline", "extend:ruler"},
             REAL_MODEL: {"extend:real", "extend:gemma3", "extend:smollm2-tasks", "extend:ruler",
                          "extend:smollm2-window", "extend:window-summary",
                          "extend:smollm2-dtype", "extend:gemma3-tasks", "extend:gemma3-dtype",
                          "extend:smollm2-n8", "extend:smollm2-n8-summary", "extend:gemma3-n8",
                          "extend:gemma3-n8-summary"},
             LAB_RESULTS: {"lab:table", "lab:length", "lab:extend", "lab:passkey"}}  # fmt: skip
    for path, names in pages.items():
        blocks = generated_blocks(path)
        assert set(blocks) == names, path.name
        assert all(text.count("\n|") >= 3 for text in blocks.values())  # each holds a table


def test_the_gemma3_block_is_the_committed_rows_table() -> None:
    """The Gemma-3-270M study runs in pieces whose rows are committed: its block must be the
    table ``posenc extend report`` makes of exactly those rows (a piece run without regenerating
    the block, or a hand edit, fails here)."""
    from posenc._markdown import markdown_table
    from posenc.extend.reports.tables import study_table
    from posenc.extend.study.run import study_rows

    rows = study_rows(ROOT / "benchmarks" / "studies" / "gemma3-270m")
    assert markdown_table(*study_table(rows)) in generated_blocks(REAL_MODEL)["extend:gemma3"]


def test_the_smollm2_block_is_the_committed_rows_table() -> None:
    """The SmolLM2-135M perplexity and passkey study (rows committed in
    benchmarks/studies/smollm2-ppl/): its block must be the table of exactly those rows."""
    from posenc._markdown import markdown_table
    from posenc.extend.reports.tables import study_table
    from posenc.extend.study.run import study_rows

    rows = study_rows(ROOT / "benchmarks" / "studies" / "smollm2-ppl")
    assert markdown_table(*study_table(rows)) in generated_blocks(REAL_MODEL)["extend:real"]


@pytest.mark.parametrize("block, folder", [("smollm2-tasks", "smollm2-135m-bf16"),
                                           ("smollm2-window", "smollm2-135m-window"),
                                           ("smollm2-n8", "smollm2-135m-n8"),
                                           ("gemma3-tasks", "gemma3-270m-tasks"),
                                           ("gemma3-n8", "gemma3-270m-n8")])  # fmt: skip
def test_the_task_blocks_are_the_committed_rows_tables(block: str, folder: str) -> None:
    """The task studies run in pieces by length whose rows are committed: each block must hold
    the task tables ``posenc extend report`` makes of exactly those rows."""
    from posenc._markdown import markdown_table
    from posenc.extend.reports.tasks import per_task_table, task_table
    from posenc.extend.study.run import study_rows

    rows = study_rows(ROOT / "benchmarks" / "studies" / folder)
    text = generated_blocks(REAL_MODEL)[f"extend:{block}"]
    assert markdown_table(*task_table(rows)) in text
    assert markdown_table(*per_task_table(rows)) in text


def test_the_readme_summary_is_the_committed_task_rows() -> None:
    """README's "which method, up to which length" table, the short block ``posenc extend summary
    --short`` writes from exactly the committed rows of the eight-sample task studies (the
    lengths that decide each effective length), and the full block (the two-sample studies
    beside them, the paired tests, the bars, the costs) on the studies' page (the Chinese README
    carries the same block: test_chinese_readme_carries_the_english_readmes_results); each
    study's own summary block on the page."""
    from posenc.extend.reports.summary import summary_markdown
    from posenc.extend.study.run import study_rows

    studies = ROOT / "benchmarks" / "studies"
    eight = ["smollm2-135m-n8", "gemma3-270m-n8"]
    every = [*eight, "smollm2-135m-bf16", "gemma3-270m-tasks"]
    rows = {n: study_rows(studies / n) for n in every}
    assert all(r["n"] >= 8 for n in eight for r in rows[n] if r["kind"] == "task")
    assert generated_blocks(READMES[0])["extend:ruler"] == (
        summary_markdown([rows[n] for n in eight], eight, True) + "\n"
    )
    assert generated_blocks(REAL_MODEL)["extend:ruler"] == (
        summary_markdown([rows[n] for n in every], every) + "\n"
    )
    for block, folder in (("window-summary", "smollm2-135m-window"),
                          ("smollm2-n8-summary", "smollm2-135m-n8"),
                          ("gemma3-n8-summary", "gemma3-270m-n8")):  # fmt: skip
        assert generated_blocks(REAL_MODEL)[f"extend:{block}"] == (
            summary_markdown([study_rows(studies / folder)], [folder]) + "\n"
        )


@pytest.mark.parametrize("block, first, second", [
    ("smollm2-dtype", "smollm2-135m", "smollm2-135m-bf16"),
    ("gemma3-dtype", "gemma3-270m-f32-tasks", "gemma3-270m-tasks")])  # fmt: skip
def test_the_dtype_blocks_are_the_committed_rows_comparison(block: str, first: str,
                                                            second: str) -> None:  # fmt: skip
    """The float32 task cells against the bfloat16 ones, the block ``posenc extend compare``
    writes from exactly the committed rows of both folders."""
    from posenc.extend.reports.compare import compare_markdown
    from posenc.extend.study.run import study_rows

    studies = ROOT / "benchmarks" / "studies"
    text = compare_markdown(study_rows(studies / first), study_rows(studies / second),
                            (first, second))  # fmt: skip
    assert generated_blocks(REAL_MODEL)[f"extend:{block}"] == text + "\n"


def test_study_docs_script_writes_every_block_of_the_page() -> None:
    """benchmarks/study_docs.py, the one command that regenerates docs/real-model.md and the
    READMEs' summary after a study piece: it names each generated block of those pages once per
    page, and each of its commands is one the CLI takes and writes that block of that page."""
    import importlib.util

    script = ROOT / "benchmarks" / "study_docs.py"
    spec = importlib.util.spec_from_file_location("study_docs", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = sorted((args[args.index("--readme") + 1], f"extend:{block}")
                     for block, args in module.COMMANDS)  # fmt: skip
    pages = (REAL_MODEL, *READMES)
    assert written == sorted((str(p.relative_to(ROOT)), name) for p in pages
                             for name in generated_blocks(p) if name.startswith("extend:"))  # fmt: skip
    for block, args in module.COMMANDS:
        assert parse_command(args) in (
            ["extend", "report"], ["extend", "compare"], ["extend", "summary"]), block  # fmt: skip
        named = args[args.index("--block") + 1] if "--block" in args else "real"  # the default
        assert named == block
        for path in args[2:]:
            if path.startswith("benchmarks/studies/"):
                assert (ROOT / path / "results.jsonl").is_file(), path


def test_readme_headline_is_the_results_pages_table() -> None:
    """The headline is the full block's first table (both written from one grid's rows by
    posenc.lab.reports.readme.headline_table): a README regenerated from other rows than the page fails."""
    full = generated_blocks(LAB_RESULTS)["lab:table"]
    assert generated_blocks(READMES[0])["lab:headline"] == full.split("\n\n", 1)[0] + "\n"


def test_chinese_readme_carries_the_english_readmes_results() -> None:
    """README.zh-CN.md has every generated results block of README.md, character for character
    (both are written by the same `posenc lab report --readme FILE`; a stale copy fails here)."""
    english, chinese = generated_blocks(READMES[0]), generated_blocks(READMES[1])
    assert set(chinese) == set(english)
    for name, text in english.items():
        assert chinese[name] == text, f"README.zh-CN.md's {name} block differs from README.md's"


def test_readme_report_writes_the_chinese_readme(tmp_path: Path) -> None:
    """The command that writes README.md's headline writes the Chinese README's the same way:
    the marker lines are the only thing it needs (posenc._markdown.replace_block)."""
    from posenc._markdown import replace_block
    from posenc.lab.reports.readme import HEADLINE_BLOCK

    copy = tmp_path / "README.zh-CN.md"
    text = READMES[1].read_text(encoding="utf-8")
    copy.write_text(text, encoding="utf-8")
    replace_block(copy, *HEADLINE_BLOCK, "| a |\n|---|\n| 1 |\n")
    new = "| a |\n|---|\n| 1 |\n"
    assert generated_blocks(copy) == {**generated_blocks(READMES[1]), "lab:headline": new}
    old = generated_blocks(READMES[1])["lab:headline"]
    assert copy.read_text(encoding="utf-8") == text.replace(old, "| a |\n|---|\n| 1 |\n")


def test_readmes_are_a_front_page() -> None:
    """The front page stays a front page (what posenc is, the two commands, one example and one
    result per part): at most 150 lines, the full tables linked in docs/."""
    for path in READMES:
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 150, path.name
