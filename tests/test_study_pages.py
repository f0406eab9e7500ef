"""A study's page (index.md) is generated from its report folder's own files: the hand-written about.md, every
table, every plot, the data files and the subfolders' tables; `fedvlp report --page DIR` rebuilds it without MLflow."""
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

from fedvlp import cli
from fedvlp.platform.studies.report import GENERATED, write_pages, write_study_page

ABOUT_BODY = """FedMPT's finding (a): label skew t in {0, 0.5, 1}. Regenerate:

```bash
# a comment, not a heading
fedvlp sweep heterogeneity --report
```

## Finding (a)

*Untestable here*;  see [the README](../../README.md#results)."""
SUMMARY = """# sweep-heterogeneity

Sweep over federation.heterogeneity; selected on val_mAP.

| method | heterogeneity t | val mAP |
|---|---|---|
| fedmpt | 0 | 0.6151 ± 0.0263 |
| promptfl | 0 | 0.6354 ± 0.0108 |
"""
BY_METHOD = """# sweep-heterogeneity

Mean over the sweep's cells.

| method | val mAP (mean over sweep) |
|---|---|
| fedmpt | 0.6109 ± 0.0259 |
"""
SIX_SETS = "| six sets | miss text |\n|---|---|\n| fedprime | 0.511 |\n"
GAP = "# sweep-heterogeneity\n\n| method | val hallucination gap |\n|---|---|\n| zeroshot | 0.0669 |\n"
PLOTS = ["val_mAP_vs_round.png", "val_mAP_difference_vs_federation.heterogeneity.png"]
FILES = {  # written in this order; the page must not depend on it
    "six_sets.md": SIX_SETS, "by_method.md": BY_METHOD, "summary.md": SUMMARY, "summary.csv": "metric,mean\n",
    "about.md": f"# Label skew (heterogeneity)\n\n{ABOUT_BODY}\n", "README.md": "README: never on the page\n",
    "hallucination_gap/summary.md": GAP, "hallucination_gap/test_hallucination_gap_vs_round.png": b"\x89PNG gap",
    "hallucination_gap/README.md": "README: never on the page\n",
    "notes/plain.txt": "a subfolder without tables or plots is no section\n", ".hidden.md": "hidden\n",
    **{name: b"\x89PNG " + name.encode() for name in PLOTS},
}


def _write_study(folder: Path, order=lambda names: names) -> Path:
    for name in order(list(FILES)):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        content = FILES[name]
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return folder


@pytest.fixture
def study(tmp_path) -> Path:
    return _write_study(tmp_path / "heterogeneity")


def _headings(page: str) -> list[str]:
    """The Markdown headings, fenced code skipped."""
    unfenced = re.sub(r"^```.*?^```$", "", page, flags=re.S | re.M)
    return [line for line in unfenced.splitlines() if re.match(r"#{1,6} ", line)]


def test_page_holds_about_tables_plots_and_subfolders_in_order(study):
    page = write_study_page(study).read_text()
    assert page.startswith(GENERATED + "\n\n# Label skew (heterogeneity)\n\n" + ABOUT_BODY + "\n\n")  # verbatim
    assert _headings(page) == [  # each table's own H1 names its section
        "# Label skew (heterogeneity)", "## Finding (a)",
        "## Summary: sweep-heterogeneity", "## By method: sweep-heterogeneity", "## Six sets", "## Plots",
        "## Data files", "## hallucination_gap", "### Summary: sweep-heterogeneity", "### Plots"]
    for table in (SUMMARY, BY_METHOD, SIX_SETS, GAP):
        assert table.split("\n\n", 1)[-1] in page  # every table's text, word for word, under its heading
    assert page.index("| fedmpt | 0 | 0.6151") < page.index("| fedmpt | 0.6109") < page.index("| six sets |")
    images = re.findall(r"!\[([^]]*)\]\(([^)]*)\)", page)
    assert images == [  # the plots sorted by name, then the subfolder's, linked relative to the page
        ("paired difference in val mAP to the reference vs heterogeneity t",
         "val_mAP_difference_vs_federation.heterogeneity.png"),
        ("val mAP vs round", "val_mAP_vs_round.png"),
        ("test hallucination gap vs round", "hallucination_gap/test_hallucination_gap_vs_round.png")]
    assert "*val mAP vs round* (`val_mAP_vs_round.png`)" in page
    assert "- [summary.csv](summary.csv)" in page
    generated = page.split(ABOUT_BODY)[1]
    for target in re.findall(r"\]\(([^)#]+)[^)]*\)", generated):  # every link resolves, relative to the page
        assert not target.startswith("/") and "://" not in target and (study / unquote(target)).is_file(), target
    for absent in ("README", "index.md", "about.md", "hidden", "notes", "plain.txt"):
        assert absent not in generated
    assert "never on the page" not in page


def test_rerun_and_other_file_order_give_the_same_bytes(study, tmp_path, monkeypatch):
    first = write_study_page(study).read_bytes()
    assert write_study_page(study).read_bytes() == first  # index.md now exists and is not read into itself
    reversed_copy = _write_study(tmp_path / "copy" / "heterogeneity", order=lambda names: names[::-1])
    assert write_study_page(reversed_copy).read_bytes() == first
    listed = Path.iterdir  # a file system that lists a folder in another order
    monkeypatch.setattr(Path, "iterdir", lambda folder: reversed(list(listed(folder))))
    assert write_study_page(study).read_bytes() == first


def test_without_about_the_study_names_the_page_and_the_folder_its_parts(study):
    (study / "about.md").unlink()
    page = write_study_page(study).read_text()
    assert page.startswith(GENERATED + "\n\n# sweep-heterogeneity\n\n## Summary: sweep-heterogeneity\n\n")
    assert "\n## hallucination_gap\n" in page  # a subfolder's section: its own name, not the study's again
    (study / "summary.md").rename(study / "kept.md")
    assert write_study_page(study).read_text().startswith(GENERATED + "\n\n# heterogeneity\n")
    shutil.rmtree(study / "hallucination_gap")
    assert "hallucination_gap" not in write_study_page(study).read_text()


def test_a_report_into_a_subfolder_updates_the_study_page_above(study):
    write_study_page(study)
    (study / "hallucination_gap" / "by_method.md").write_text("| rerun | 0.5 |\n|---|---|\n")
    write_pages(study / "hallucination_gap")
    assert "## By method\n\n| rerun | 0.5 |" in (study / "hallucination_gap" / "index.md").read_text()
    assert "### By method\n\n| rerun | 0.5 |" in (study / "index.md").read_text()
    # a hand-written page above is never overwritten
    (study / "index.md").write_text("hand-written\n")
    write_pages(study / "hallucination_gap")
    assert (study / "index.md").read_text() == "hand-written\n"


def test_cli_page_rebuilds_committed_folders_without_mlflow(study, tmp_path, capsys, monkeypatch):
    other = tmp_path / "tuning"
    other.mkdir()
    (other / "quickstart.yaml").write_text("method: {name: promptfl}\n")
    monkeypatch.chdir(tmp_path)  # no mlflow.db here, and none is created
    assert cli.main(["report", "--page", str(study), "tuning/"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"page: {study / 'index.md'}", "page: tuning/index.md"]
    assert (study / "index.md").read_bytes() == write_study_page(study).read_bytes()
    assert (other / "index.md").read_text() == (f"{GENERATED}\n\n# tuning\n\n## Data files\n\n"
                                                "- [quickstart.yaml](quickstart.yaml)\n")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("argv, message", [
    (["report"], "report: no EXPERIMENT; expected a sweep's MLflow experiment"),
    (["report", "sweep-x", "--page", "{study}"], "report --page DIR rebuilds a page from DIR's files alone"),
    (["report", "--page", "{study}", "--out", "x"], "expected no EXPERIMENT, --metric, --reference, --change, --out"),
    (["report", "--page", "{study}/nope"], "{study}/nope is not a folder; expected a report folder"),
])
def test_cli_page_misuse_is_a_one_line_error(study, capsys, argv, message):
    assert cli.main([a.format(study=study) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedvlp: error: ") and message.format(study=study) in err and err.count("\n") == 1
    assert not (study / "index.md").exists()


COMMITTED = sorted(p.parent for p in (Path(__file__).resolve().parent.parent / "docs/results").glob("*/index.md"))


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_every_committed_study_page_is_what_its_folder_generates(folder, tmp_path):
    """An edit to a study's about.md or tables without `fedvlp report --page` leaves its page stale: caught here."""
    copy = shutil.copytree(folder, tmp_path / folder.name)
    assert write_study_page(copy).read_text() == (folder / "index.md").read_text(), (
        f"{folder}/index.md is stale: run fedvlp report --page {folder.relative_to(folder.parents[2])}")
