"""Every import is declared where it is used: the package's in `dependencies`, the tests' in the `dev` extra (or
the package's), the benchmarks' in `bench` (or `bench-pfl`, dev, or the package's); and the wheel ships the configs
and spaces."""
import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCAL = {"fedvlp", "conftest", "fedvlp_test_plugin", "fedvlp_examples", "test_readers", "test_clustering",
         "test_faults", "_common", "performance"}


def _names(requirements) -> set[str]:
    return {Requirement(r).name.lower().replace("_", "-") for r in requirements}


DECLARED = {
    "runtime": _names(PROJECT["dependencies"]),
    "dev": _names(PROJECT["optional-dependencies"]["dev"]),
    "bench": _names(PROJECT["optional-dependencies"]["bench"]),
    "bench-pfl": _names(PROJECT["optional-dependencies"]["bench-pfl"]),  # its own virtual environment
}
# Distributions that come with a declared one (ray[tune] brings pandas/pyarrow; mlflow brings sqlalchemy ...)
# are not enough: an import must name its own distribution, so it survives its provider dropping it.
PROVIDERS = importlib.metadata.packages_distributions()


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """top-level module -> files of `folder` importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def _undeclared(folder: str, allowed: set[str]) -> dict[str, set[str]]:
    missing = {}
    for module, files in imported_modules(REPO / folder).items():
        if module in sys.stdlib_module_names or module in LOCAL or (REPO / folder / f"{module}.py").exists():
            continue  # the standard library, fedvlp's own, or a sibling script (placement.py imports overhead.py)
        distributions = {d.lower().replace("_", "-") for d in PROVIDERS.get(module, [module])}
        if not distributions & allowed:
            missing[f"{module} (from {', '.join(sorted(distributions))})"] = files
    return missing


@pytest.mark.parametrize("folder, extras", [("fedvlp", ("runtime",)), ("tests", ("runtime", "dev")),
                                            ("benchmarks", ("runtime", "dev", "bench", "bench-pfl")),
                                            ("examples", ("runtime",))])
def test_every_import_is_declared_where_it_is_used(folder, extras):
    allowed = set().union(*(DECLARED[e] for e in extras))
    assert _undeclared(folder, allowed) == {}


def test_the_check_catches_an_undeclared_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import yaml\nimport sklearn.metrics\nimport json\n")
    assert set(_undeclared("pkg", {"pyyaml"})) == {"sklearn (from scikit-learn)"}


def test_the_package_data_ships_the_configs_spaces_and_tiny_backbones():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fedvlp"]
    shipped = {"configs/*.yaml", "tune_spaces/*.yaml", "backbones/model_configs/*.json", "backbones/weights/*"}
    assert shipped <= set(data)
    assert list((REPO / "fedvlp" / "configs").glob("*.yaml")) and list((REPO / "fedvlp" / "tune_spaces").glob("*.yaml"))
    weights = [REPO / "fedvlp" / "backbones" / "weights" / f for f in
               ("manifest.json", "tiny-clip.safetensors", "tiny-vilt.safetensors")]
    assert all(w.is_file() for w in weights)
    # checkpoints are ignored everywhere else; these must reach a clone
    ignored = subprocess.run(["git", "check-ignore", *map(str, weights)], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout == ""


def test_start_up_imports_no_model_library():
    """Driver, coordinator and worker modules import no model library: open_clip (with torchvision), transformers
    and peft cost a process 0.7-1.5 CPU s each at start-up, so each is imported where it is used; nor torch, which
    the driver never needs (`tests/test_driver.py` runs one)."""
    code = ("import sys, fedvlp.cli, fedvlp.platform.engine, fedvlp.platform.worker, fedvlp.platform.coordinator; "
            "print(sorted(m for m in ('peft', 'open_clip', 'transformers', 'torchvision', 'torch') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
