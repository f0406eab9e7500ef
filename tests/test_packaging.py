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
    code = ("import sys, fedvlp.cli, fedvlp.platform.runtime.engine, fedvlp.platform.runtime.worker, "
            "fedvlp.platform.runtime.coordinator, fedvlp.platform.engine; "
            "print(sorted(m for m in ('peft', 'open_clip', 'transformers', 'torchvision', 'torch') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_server_rules_import_without_torch_or_scipy():
    """The config and a run's driver read the rule registry: importing it registers every built-in rule, and the
    rules import torch and scipy (the clustering) only as they run."""
    code = ("import sys; from fedvlp.platform.aggregation import RULES; "
            "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules), RULES.names())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[] ['fedadagrad', 'fedadam', 'fedavg', 'fedavgm', 'fedyogi', 'hungarian', 'mean']"


# ---------------------------------------------------------------- the package's own imports

PLATFORM = "fedvlp.platform"
# fedvlp/platform/'s rooms and what each may import besides itself (records and metrics, a module, are leaves every
# room may import); the other modules directly in fedvlp/platform/ are public paths only (re-exports, `SHIMS`), which
# nothing in the package imports
MAY_IMPORT = {"studies": {"runtime", "aggregation", "records", "metrics"},
              "runtime": {"aggregation", "records", "metrics"},
              "aggregation": {"records", "metrics"},
              "records": {"metrics"},
              "metrics": set()}
SHIMS = ("engine", "checkpoint", "sweep", "tune", "report")


def package_modules(folder: Path = REPO / "fedvlp") -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package by its __init__.py)."""
    modules = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = package_modules()


def fedvlp_imports(path: Path, name: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every fedvlp module the file imports, at its top or inside a function, absolute or relative;
    `from fedvlp.x import y` imports fedvlp.x.y when that is a module, else fedvlp.x. `name`: the file's module
    (for relative imports)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from the file's package (`.`), or the one above it (`..`), ...
                package = (name or "").split(".")[: None if path.name == "__init__.py" else -1]
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            found += [(node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
                      for alias in node.names]
    return [(line, module) for line, module in found if module == "fedvlp" or module.startswith("fedvlp.")]


def room(module: str) -> str | None:
    """The room of fedvlp/platform/ a module is in (runtime, aggregation, studies, records, metrics), "shim" for the
    public paths, None outside fedvlp/platform/."""
    if not module.startswith(PLATFORM + "."):
        return None
    top = module.split(".")[2]
    return "shim" if top in SHIMS else top


def test_platform_imports_run_one_way():
    """studies -> runtime -> aggregation, records and metrics leaves: a room never imports one that imports it (the
    aggregation never imports the runtime or the studies, the runtime never imports the studies); outside the
    platform only the command line imports a run's rooms (the methods, backbones, data and config read the rules'
    registry and the metrics); and nothing in the package imports the public re-export paths."""
    assert {room(m) for m in MODULES if room(m)} == {*MAY_IMPORT, "shim"}
    wrong = []
    for module, path in MODULES.items():
        for line, imported in fedvlp_imports(path, module):
            mine, theirs = room(module), room(imported)
            if theirs == "shim" and mine != "shim" or \
                    mine is None and module != "fedvlp.cli" and theirs not in (None, "aggregation", "metrics") or \
                    mine in MAY_IMPORT and theirs not in (None, mine) and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(REPO)}:{line} ({mine}) imports {imported} ({theirs})")
    assert wrong == []


def test_the_check_catches_an_import_against_the_direction(tmp_path):
    bad = tmp_path / "fedvlp" / "platform" / "aggregation" / "rules.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from fedvlp.platform.runtime.engine import run_federated\n")
    assert fedvlp_imports(bad, "fedvlp.platform.aggregation.rules") == [(2, "fedvlp.platform.runtime.engine")]
    assert room("fedvlp.platform.runtime.engine") not in MAY_IMPORT[room("fedvlp.platform.aggregation.rules")]
    relative = tmp_path / "fedvlp" / "platform" / "aggregation" / "__init__.py"
    relative.write_text("from ..runtime import engine\nfrom .rules import RULES\n")
    assert fedvlp_imports(relative, "fedvlp.platform.aggregation") == [
        (1, "fedvlp.platform.runtime.engine"), (2, "fedvlp.platform.aggregation.rules")]


def test_the_public_paths_are_the_modules_they_re_export():
    """fedvlp.platform.engine, .checkpoint, .sweep, .tune and .report keep their entry points (the same objects),
    and hold nothing but re-exports."""
    import importlib

    for shim in SHIMS:
        public = importlib.import_module(f"{PLATFORM}.{shim}")
        tree = ast.parse(MODULES[f"{PLATFORM}.{shim}"].read_text())
        assert all(isinstance(node, (ast.Expr, ast.ImportFrom, ast.Assign)) for node in tree.body), shim
        sources = [importlib.import_module(node.module) for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert public.__all__ and all(any(getattr(source, name, None) is getattr(public, name) for source in sources)
                                      for name in public.__all__), shim
    from fedvlp.platform import checkpoint, engine, report, sweep, tune

    assert [f.__module__ for f in (engine.run_federated, checkpoint.read_checkpoint, sweep.load_sweep, sweep.run_sweep,
                                   tune.run_tune, report.make_report)] == [
        f"{PLATFORM}.runtime.engine", f"{PLATFORM}.records.checkpoint", f"{PLATFORM}.studies.spaces",
        f"{PLATFORM}.studies.sweep", f"{PLATFORM}.studies.tune", f"{PLATFORM}.studies.report.build"]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at its top or in a function)."""
    return {module: {m for _, m in fedvlp_imports(path, module) if m in MODULES and m != module}
            for module, path in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a circle (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_one_that_imports_it_back():
    """No circles through the package's imports, a function's included (a registry loads its built-ins by name, as
    plugins are loaded, not by importing them)."""
    assert circles(import_graph()) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def private_uses(path: Path) -> list[str]:
    """Another fedvlp module's private names that the file imports (`from fedvlp.x import _y`) or reads from a
    module it imported (`x._y`)."""
    tree = ast.parse(path.read_text())
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedvlp") and not node.level:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.lineno}: {node.module}.{alias.name}")
                elif f"{node.module}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            aliases.update({alias.asname: alias.name for alias in node.names
                            if alias.asname and alias.name.startswith("fedvlp")})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


# The pretraining recipes' source is hashed into the shipped weights' keys (`fedvlp.backbones.pretrain._Recipe.key`):
# changing a line of them would orphan the weights, so their import of the recipes' base class stays as it is.
HASHED = {"fedvlp/backbones/pretrain_clip.py": ["29: fedvlp.backbones.pretrain._Recipe"],
          "fedvlp/backbones/pretrain_vilt.py": ["25: fedvlp.backbones.pretrain._Recipe"]}


@pytest.mark.parametrize("folder", ["fedvlp", "benchmarks"])
def test_no_module_reaches_into_another_modules_private_names(folder):
    uses = {str(path.relative_to(REPO)): private_uses(path) for path in sorted((REPO / folder).rglob("*.py"))}
    assert {path: found for path, found in uses.items() if found and HASHED.get(path) != found} == {}


def test_the_check_catches_a_reach_into_a_private_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from fedvlp.platform.studies.spaces import _secret\nfrom fedvlp.platform.runtime import engine\n"
                   "engine._open_tracker\n")
    assert private_uses(bad) == ["1: fedvlp.platform.studies.spaces._secret",
                                 "3: fedvlp.platform.runtime.engine._open_tracker"]
