"""The layout shows the design: the top level holds the card's entries, entry points import shared modules and never
each other, the import graph has no cycle (function-local imports included), no import climbs a floor (data/ into
attnlab/), and lazy imports are for optional dependencies and sharding only."""
import ast
import re
import subprocess
import sys

import pytest
from conftest import REPO

ENTRY_POINTS = {"train", "sample", "data.prepare", "scripts.evaluate", "scripts.attention", "scripts.export",
                "scripts.hellaswag", "scripts.runs", "scripts.bench", "scripts.report.__main__", "scripts.report.gpu"}
# the design card's entries, the shared library, the secondary commands, and the files every project has
TOP_LEVEL = {"model.py", "train.py", "sample.py", "configs", "data", "attnlab", "scripts", "tests", "docs", "README.md",
             "LICENSE", "pyproject.toml", ".gitignore", ".ci"}
# imported where they are used, so the rest runs without them
OPTIONAL = {"transformers", "tokenizers", "wandb", "matplotlib"}
# imported where they are used, since they slow every run's start-up and only some runs need them: a sharded run the
# sharding machinery, a .parquet corpus pyarrow
SHARDING = {"torch.distributed.fsdp", "torch.distributed.checkpoint.state_dict"}
PARQUET = {"pyarrow.parquet"}


def project_modules():
    """{module name: parsed file} for every Python file of the project outside tests/."""
    files = [*REPO.glob("*.py"), *REPO.glob("attnlab/*.py"), *REPO.glob("data/*.py"), *REPO.glob("scripts/**/*.py")]
    def name(p):
        return ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")

    return {name(p): ast.parse(p.read_text()) for p in files}


def imports(tree):
    """(module imported, at top level?) for every import statement in tree."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def test_the_top_level_shows_the_design():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert {path.split("/")[0] for path in tracked} <= TOP_LEVEL


def test_entry_points_import_shared_modules_never_each_other():
    modules = project_modules()
    wrong = [(name, imported) for name, tree in modules.items() for imported, _ in imports(tree)
             if imported in ENTRY_POINTS and imported != name]
    assert not wrong


def test_the_import_graph_has_no_cycle():
    modules = project_modules()
    graph = {name: {m for m, _ in imports(tree) if m in modules and m != name} for name, tree in modules.items()}
    visiting, done = set(), set()

    def visit(name, path):
        assert name not in visiting, f"import cycle: {' -> '.join(path + [name])}"
        if name in done:
            return
        visiting.add(name)
        for child in graph[name]:
            visit(child, path + [name])
        visiting.discard(name)
        done.add(name)

    for name in graph:
        visit(name, [])


def test_no_import_climbs_a_floor():
    # the corpora are a floor below the shared library: its modules read them, their command (data.prepare) uses both
    climbing = [(name, imported) for name, tree in project_modules().items()
                if name.startswith("data.") and name not in ENTRY_POINTS
                for imported, _ in imports(tree) if imported.split(".")[0] == "attnlab"]
    assert not climbing


def test_lazy_imports_are_for_optional_dependencies_sharding_and_parquet_only():
    lazy = [(name, imported) for name, tree in project_modules().items() for imported, top in imports(tree)
            if not top and imported.split(".")[0] not in OPTIONAL and imported not in SHARDING | PARQUET]
    assert not lazy


def test_a_single_process_run_never_imports_the_sharding_machinery_or_pyarrow():
    code = f"import sys, train; print(sorted(set(sys.modules) & {SHARDING | PARQUET!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_test_the_docs_cite_exists():
    defined = {m for p in (REPO / "tests").glob("test_*.py") for m in re.findall(r"def (test_\w+)", p.read_text())}
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    cited = {name for doc in docs for name in re.findall(r"\b(test_\w+)\b", doc.read_text())}
    cited -= {p.stem for p in (REPO / "tests").glob("test_*.py")}  # file names, not test names
    assert cited and not cited - defined, sorted(cited - defined)
