"""The documentation site (mkdocs.yml, docs/) and the README: every shipped config and space is named on a page, every
guide is in the nav, the README fits on two screens and its links hold, every study page is what `fedvlp report --page`
builds from its folder, and `mkdocs build --strict` passes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README_MAX_LINES = 160
QUICK_START = ("pip install -e '.[dev]' && fedvlp run", "python -m pytest")  # CI runs the second exactly


def pages() -> dict[Path, str]:
    """Every Markdown page the site builds, with its text."""
    return {path: path.read_text() for path in sorted(DOCS.rglob("*.md"))}


def study_folders() -> list[Path]:
    """docs/results/<study>/: a report folder whose page (index.md) is generated from its about.md and files."""
    return sorted(about.parent for about in DOCS.glob("results/*/about.md"))


def nav_pages(nav) -> list[str]:
    """The page paths of an mkdocs nav, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for entry in nav for page in nav_pages(entry)]


def unnamed(names: list[str], named) -> list[str]:
    text = "\n".join(pages().values())
    return [name for name in names if not re.search(named(re.escape(name)), text)]


def test_every_shipped_config_is_named_on_a_site_page():
    configs = sorted(p.stem for p in (REPO / "fedvlp/configs").glob("*.yaml"))
    assert len(configs) > 30
    # `name`, name.yaml or `fedvlp run|tune name`: a brace pattern such as {fedprime,fedavg_p}_food101 names none
    assert unnamed(configs, lambda n: rf"`{n}`|\b{n}\.yaml\b|fedvlp (?:run|tune) {n}\b") == []


def test_every_space_is_named_on_a_site_page():
    spaces = sorted(p.stem for p in (REPO / "fedvlp/tune_spaces").glob("*.yaml"))
    assert "smoke" in spaces and "heterogeneity" in spaces
    assert unnamed(spaces, lambda n: rf"fedvlp sweep {n}\b|tune_spaces/{n}\.yaml\b") == []


def test_every_guide_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = nav_pages(config["nav"])
    assert len(nav) == len(set(nav))
    studies = study_folders()
    assert {s.name for s in studies} >= {"heterogeneity", "participation", "label_mask", "fedmpt_ablation",
                                         "fedprime_settings", "fedprime_pools", "missing_rate", "privacy"}
    # a study folder's other files (about.md, summary.md, ...) are parts of its page, not guides
    guides = {p.relative_to(DOCS).as_posix() for p in pages() if not any(s in p.parents for s in studies)}
    study_pages = {(s / "index.md").relative_to(DOCS).as_posix() for s in studies}
    assert sorted((guides | study_pages) - set(nav)) == []
    assert sorted(set(nav) - guides - study_pages) == []
    for required in ("extending.md", "architecture.md", "server-optimisers.md", "reference.md", "performance.md"):
        assert required in nav


def test_the_readme_fits_on_two_screens_and_its_links_hold():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert tuple(blocks[:2]) == QUICK_START
    generated = {s / "index.md" for s in study_folders()}  # written by `fedvlp report --page`
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if "://" not in target:
            path = REPO / target
            assert path.exists() or path in generated, target


def test_every_study_page_is_rebuilt_from_its_folder(tmp_path):
    """An about.md edited without `fedvlp report --page DIR` leaves a stale index.md on the site."""
    from fedvlp.platform.studies.report import MARK, PAGE, write_study_page

    pages_found = [page for page in sorted(DOCS.glob("results/**/" + PAGE)) if page.read_text().startswith(MARK)]
    assert len(pages_found) >= len(study_folders())
    for n, page in enumerate(pages_found):
        copy = tmp_path / str(n) / page.parent.name
        shutil.copytree(page.parent, copy)
        assert write_study_page(copy).read_text() == page.read_text(), f"{page.relative_to(REPO)} is stale: run " \
            f"fedvlp report --page {page.parent.relative_to(REPO)}"


def test_the_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a missing page, a page outside the nav or a docstring the
    API reference cannot render fails it. It builds offline: no web font, every linked repository file published."""
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stdout + build.stderr
    reference = (site / "reference.html").read_text()
    for symbol in ("fedvlp.platform.engine.run_federated", "fedvlp.config.RunSpec", "fedvlp.methods.base.Method",
                   "fedvlp.registry.Registry", "fedvlp.platform.aggregation.ServerRule"):
        assert f'id="{symbol}"' in reference, symbol
    for study in study_folders():
        assert (site / "results" / study.name / "index.html").is_file(), study.name
    home = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in home and "fonts.gstatic.com" not in home
    for html in site.rglob("*.html"):
        for target in re.findall(r'href="((?:\.\./)*_repo/[^"#]+)"', html.read_text()):
            assert (html.parent / target).is_file(), (html, target)
