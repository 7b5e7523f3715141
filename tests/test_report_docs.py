"""The report has one source of truth: every results table in README.md and docs/ is a copy of rows of the
committed reports/attention_vs_rnn/results.csv, and names the hardware that runs.json says the rows came from."""
import csv
import json

from conftest import REPO

REPORT = REPO / "reports/attention_vs_rnn"
HEADER = "| experiment | measure | GPT (attention) | LSTM (recurrence) |"


def quoted_tables():
    """{doc: [(experiment, measure, gpt, lstm)]} for every table in the docs that starts with HEADER."""
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


def test_docs_quote_the_committed_results_verbatim():
    results = {(r["experiment"], r["measure"], r["gpt"], r["lstm"]) for r in csv.DictReader(
        (REPORT / "results.csv").open())}
    tables = quoted_tables()
    assert "README.md" in tables  # the README shows the headline rows
    for doc, rows in tables.items():
        assert rows and not set(rows) - results, (doc, sorted(set(rows) - results))


def test_docs_that_quote_results_name_the_hardware_they_came_from():
    runs = json.loads((REPORT / "runs.json").read_text())
    for doc in quoted_tables():
        text = (REPO / doc if doc == "README.md" else REPO / "docs" / doc).read_text()
        quoted = {r[0] for r in quoted_tables()[doc]}
        assert all(runs[experiment]["hardware"] in text for experiment in quoted), doc
