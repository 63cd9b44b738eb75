"""The README and the docs keep to the code: the README's size, its generated methods table, its two
commands (`.ci/run` runs the test one), its stage-by-stage example (every command parses, and, slow,
runs on the real MiniLM), every `linearize` command in the README and docs/usage.md parses, every
relative link resolves, and the experiments index lists every study with an honest status.

`python tests/test_readme.py` rewrites the README's generated blocks (the methods table)."""

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
EXPERIMENTS = ROOT / "docs" / "experiments"
MAX_README_BYTES = 15_000
REGENERATE = "regenerate it with: .venv/bin/python tests/test_readme.py"


def marked_block(text, name):
    """The text between ``<!-- name -->`` and ``<!-- /name -->`` (each on its own line)."""
    match = re.search(rf"^<!-- {re.escape(name)} -->\n(.*?)^<!-- /{re.escape(name)} -->$", text, re.S | re.M)
    assert match, f"README.md lacks the markers <!-- {name} --> ... <!-- /{name} -->"
    return match.group(1)


def replace_block(text, name, content):
    marked_block(text, name)
    return re.sub(rf"(^<!-- {re.escape(name)} -->\n).*?(^<!-- /{re.escape(name)} -->$)",
                  lambda m: m.group(1) + content + m.group(2), text, count=1, flags=re.S | re.M)


def generated_blocks():
    """Each generated block of the README: marker name -> the text it must hold."""
    from linearize.attention.feature_maps import methods_table

    return {"methods-table": methods_table()}


def code_blocks(text, language="bash"):
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.S | re.M)


def linearize_commands(text):
    """The argument lists of the `linearize ...` (or `... -m linearize.cli ...`) lines of the bash
    blocks of ``text``: continuation lines joined, comments dropped."""
    commands = []
    for block in code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["linearize"]:
                commands.append(words[1:])
            elif "linearize.cli" in words and words[words.index("linearize.cli") - 1] == "-m":
                commands.append(words[words.index("linearize.cli") + 1:])
    return commands


try:  # typer >= 0.20 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover
    from click.exceptions import UsageError


def is_group(command):
    return hasattr(command, "list_commands")


def sub_command(group, name, info_name="linearize"):
    return group.get_command(group.context_class(group, info_name=info_name), name)


def cli_root():
    import typer

    from linearize.cli import app

    return typer.main.get_command(app)


def parse_command(args):
    """Parse ``linearize ARGS`` as the CLI would (sub-commands, options, their types), without
    running it: raises UsageError (or one of its kinds) for an invalid invocation."""
    command, path, args = cli_root(), ["linearize"], list(args)
    while is_group(command):
        if not args:
            raise UsageError(f"`{' '.join(path)}` needs a sub-command")
        name, args = args[0], args[1:]
        sub = sub_command(command, name, path[-1])
        if sub is None:
            raise UsageError(f"`{' '.join(path)}` has no sub-command {name!r}")
        command, path = sub, path + [name]
    command.make_context(" ".join(path), args)
    return path


# -- size and generated blocks -------------------------------------------------------------------

def test_readme_is_at_most_15000_bytes():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, (
        f"README.md is {size:,} bytes, over {MAX_README_BYTES:,}: move study details, measurement prose and "
        "long tables to docs/usage.md or the study's docs/experiments/*/RESULTS.md and link them")


@pytest.mark.parametrize("name", ["methods-table"])
def test_readme_generated_block_is_current(name):
    block = marked_block(README.read_text(), name)
    assert block == generated_blocks()[name], (
        f"README.md's <!-- {name} --> block differs from what the code generates "
        f"(linearize.attention.feature_maps.methods_table()); {REGENERATE}")


# -- the two commands ----------------------------------------------------------------------------

def two_commands():
    section = README.read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [block.strip() for block in code_blocks(section)]
    assert len(blocks) == 2, "README's 'Two commands' section should hold exactly two bash blocks"
    return blocks


def test_readme_has_the_main_job_and_the_test_command_and_ci_runs_the_test_command():
    main_job, tests = two_commands()
    assert main_job == "bash scripts/setup.sh && .venv/bin/linearize run"
    assert tests.startswith("bash scripts/setup.sh && ") and "pytest" in tests
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci, f".ci/run must run exactly the README's test command: {tests!r}"


# -- commands ------------------------------------------------------------------------------------

def stage_by_stage_commands():
    commands = linearize_commands(marked_block(README.read_text(), "stage-by-stage"))
    assert commands, "the README's <!-- stage-by-stage --> block holds no `linearize` commands"
    return commands


def model_argument(args):
    return args[2] if args[0] == "eval" else args[1]  # `eval text MODEL`, `convert MODEL`, ...


def output(args):
    return args[args.index("--out") + 1]


def test_stage_by_stage_example_is_in_the_order_that_works():
    """Issue 36: `convert minilm` -> `distill` -> `finetune` fails at `finetune` (no classification
    head). The teacher is fine-tuned first and the student converted from it."""
    commands = stage_by_stage_commands()
    verbs = [args[0] for args in commands]
    assert verbs[:4] == ["finetune", "convert", "distill", "finetune"], verbs
    assert model_argument(commands[1]) == output(commands[0]), \
        "the student must be converted from the fine-tuned teacher"
    for before, after in zip(commands[1:], commands[2:]):  # each stage reads the previous one's --out
        assert model_argument(after) == output(before), (before, after)
    for args in commands:
        parse_command(args)


def documented_commands():
    return [pytest.param(args, id=f"{doc.name}: linearize {' '.join(args)}"[:120])
            for doc in (README, USAGE) for args in linearize_commands(doc.read_text())]


@pytest.mark.parametrize("args", documented_commands())
def test_documented_commands_parse(args):
    root = cli_root()
    if args and args[0] == "bench" and not is_group(sub_command(root, "bench")):
        pytest.skip("`linearize bench` has no sub-verbs (attention, long, folder) yet")
    try:
        parse_command(args)
    except UsageError as error:
        pytest.fail(f"`linearize {shlex.join(args)}` does not parse: {error.format_message()}")


FAST = {  # appended to the README's commands so that the real MiniLM runs them in well under a minute
    "finetune": ["--max-steps", "2", "--max-length", "32"],
    "distill": ["--max-steps", "2", "--eval-batches", "1", "--max-length", "32"],
    "eval": ["--max-length", "32"],
}
POSITIVE = ["a fine, moving film", "warm and funny", "beautifully acted", "a delight", "sharp and clever",
            "great fun", "tender and wise", "a triumph"]
NEGATIVE = ["dull and flat", "a tedious mess", "badly written", "a bore", "lifeless and slow", "awful jokes",
            "clumsy and shrill", "a waste"]


def small_task(folder):
    """``--task files`` options for a few labelled sentences: they replace the README's movie reviews
    (the last ``--task`` wins), so that each command reads and scores 16 sentences, not 4,000."""
    import csv

    options = ["--task", "files"]
    for split in ("train", "validation", "test"):
        path = folder / f"{split}.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            for good, bad in zip(POSITIVE, NEGATIVE):
                writer.writerows([[f"{good} ({split})", "pos"], [f"{bad} ({split})", "neg"]])
        options += [f"--{split}-file", str(path)]
    return options


@pytest.mark.slow
def test_stage_by_stage_example_runs_on_the_real_minilm(tmp_path, monkeypatch, minilm_path):
    """The README's stage-by-stage commands as written, in order, on the real all-MiniLM-L6-v2, with a
    step limit and 16 sentences a split in place of the movie reviews: each succeeds, and the model
    stage 2 saves has the task's head (issue 36: converted straight from MiniLM it had none)."""
    import json

    from typer.testing import CliRunner

    from linearize.cli import app

    data = small_task(tmp_path)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    commands = stage_by_stage_commands()
    for args in commands:
        extra = FAST.get(args[0], []) + (data if "--task" in args else [])
        result = runner.invoke(app, args + extra)
        assert result.exit_code == 0, f"`linearize {shlex.join(args)}` failed:\n{result.output}"
    config = json.loads((tmp_path / output(commands[3]) / "config.json").read_text())
    assert config["linearize"] and config["architectures"][0].endswith("ForSequenceClassification")


# -- links ---------------------------------------------------------------------------------------

def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group(0) == "_" else "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def relative_links(path):
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("doc", [README, USAGE, EXPERIMENTS / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = []
    for target in relative_links(doc):
        file, _, anchor = target.partition("#")
        resolved = (doc.parent / file).resolve() if file else doc
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


# -- the experiments index -----------------------------------------------------------------------

NOT_MEASURED = re.compile(r"not (yet )?measured|not measured yet|to be measured|pending|in progress", re.I)


def index_rows():
    """study folder -> its row of docs/experiments/README.md's table."""
    rows = {}
    for line in (EXPERIMENTS / "README.md").read_text().splitlines():
        match = re.match(r"\| \[[^\]]+\]\(([^)/]+)/RESULTS\.md\) \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def has_results_table(results):
    return re.search(r"^\|\s*:?-{2,}", results, re.M) is not None


def test_experiments_index_lists_every_study_and_only_studies():
    studies = {p.name for p in EXPERIMENTS.iterdir() if p.is_dir()}
    listed = set(index_rows())
    assert not studies - listed, f"docs/experiments/README.md does not list: {sorted(studies - listed)}"
    assert not listed - studies, f"docs/experiments/README.md lists missing studies: {sorted(listed - studies)}"
    for study in studies:
        assert (EXPERIMENTS / study / "RESULTS.md").is_file(), f"docs/experiments/{study} has no RESULTS.md"


def test_experiments_index_status_matches_each_study():
    """A study whose RESULTS.md holds a results table is not 'not yet measured' in the index, and one
    without a table is not listed as if it had results."""
    for study, row in index_rows().items():
        results = (EXPERIMENTS / study / "RESULTS.md").read_text()
        if has_results_table(results):
            assert not NOT_MEASURED.search(row), (
                f"docs/experiments/README.md calls {study} unmeasured, but its RESULTS.md has results: {row}")
        else:
            assert NOT_MEASURED.search(row), (
                f"docs/experiments/{study}/RESULTS.md has no results table; say so in the index: {row}")


def main():
    text = README.read_text()
    for name, content in generated_blocks().items():
        text = replace_block(text, name, content)
    README.write_text(text)
    print(f"README.md: regenerated {', '.join(generated_blocks())}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
