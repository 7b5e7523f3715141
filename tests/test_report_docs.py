"""The report has one source of truth: every results table in README.md and docs/ is a copy of rows of a committed
scripts/report/results/quick*/results.csv (the quick preset's, the full preset's), and names the hardware that the
report's runs.json says the rows came from."""
import csv
import json

from conftest import REPO

REPORTS = [REPO / "scripts/report/results" / preset for preset in ("quick", "full")
           if (REPO / "scripts/report/results" / preset / "results.csv").exists()]
HEADER = "| experiment | measure | GPT (attention) | LSTM (recurrence) | minGRU (parallel recurrence) |"


def quoted_tables():
    """{doc: [(experiment, measure, gpt, lstm, mingru)]} for every table in the docs that starts with HEADER."""
    tables = {}
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == HEADER:
                rows = []
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    rows.append(tuple(cell.strip() for cell in row.strip().strip("|").split("|")))
                tables.setdefault(doc.name, []).extend(rows)
    return tables


def report_rows(report):
    return {(r["experiment"], r["measure"], r["gpt"], r["lstm"], r.get("mingru") or "") for r in csv.DictReader(
        (report / "results.csv").open())}


def test_docs_quote_the_committed_results_verbatim():
    results = set().union(*map(report_rows, REPORTS))
    tables = quoted_tables()
    assert "README.md" in tables and REPORTS[0].name == "quick"  # the README shows the quick preset's headline rows
    for doc, rows in tables.items():
        assert rows and not set(rows) - results, (doc, sorted(set(rows) - results))


def test_docs_that_quote_results_name_the_hardware_they_came_from():
    for doc, rows in quoted_tables().items():
        text = (REPO / doc if doc == "README.md" else REPO / "docs" / doc).read_text()
        for report in REPORTS:
            runs = json.loads((report / "runs.json").read_text())
            quoted = {row[0] for row in set(rows) & report_rows(report)}
            assert all(runs[experiment]["hardware"] in text for experiment in quoted), (doc, report.name)


def test_the_report_doc_opens_with_the_quick_reports_verdict_verbatim():
    results = (REPORTS[0] / "results.md").read_text()
    verdict = results[results.index("| reason attention replaced RNNs"):].split("\n\n")[0]
    assert verdict.count("\n") == 4 and verdict in (REPO / "docs/report.md").read_text()


def test_every_decimal_in_the_readmes_report_section_comes_from_the_committed_results():
    """The README's summary is prose, not a copied table: each measured figure in it (a number with a decimal
    point) must appear in a committed results.csv, verdicts.csv or runs.json, so a rerun that moves a number shows
    here until the prose follows."""
    import re
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Why attention replaced RNNs"):readme.index("## Tests")]
    committed = "".join((report / name).read_text() for report in REPORTS
                        for name in ("results.csv", "verdicts.csv", "runs.json") if (report / name).exists())
    figures = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", section))
    assert figures and not {f for f in figures if f not in committed}, sorted(f for f in figures if f not in committed)
