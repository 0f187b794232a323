"""The repository root is a safe working directory for any Python interpreter.

Python puts the current directory first on `sys.path` for `python -c`, `python -m` and the
REPL; a package folder at the root named like a standard-library module (`operator/`)
would replace that module for the whole interpreter. These tests start interpreters that
know nothing of the project (a fresh venv, no editable-install `.pth`) in the root.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _stdlib_names() -> set[str]:
    return set(sys.stdlib_module_names)


def test_no_root_folder_is_a_package_named_like_a_stdlib_module():
    clashes = [
        p.name
        for p in REPO.iterdir()
        if p.is_dir() and p.name in _stdlib_names() and (p / "__init__.py").exists()
    ]
    assert clashes == []


def test_import_names_map_to_the_src_trees():
    import sluice.operator
    import sluice.runtime

    assert Path(sluice.runtime.__file__).is_relative_to(REPO / "runtime" / "src")
    assert Path(sluice.operator.__file__).is_relative_to(REPO / "operator" / "src")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with pip but without the project (or anything else) installed."""
    root = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    return root / "bin" / "python"


@pytest.mark.slow
def test_a_bare_interpreter_in_the_root_imports_the_real_operator_module(bare_python: Path):
    done = subprocess.run(
        [
            str(bare_python),
            "-c",
            "import collections, operator; print(operator.itemgetter(0)([7]))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7"


@pytest.mark.slow
def test_pip_runs_as_a_module_from_the_root(bare_python: Path):
    done = subprocess.run(
        [str(bare_python), "-m", "pip", "--version"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pip ")


# ---- the runtime's floors -------------------------------------------------------------------
# A module imports only modules of lower floors (or of its own package); imports inside
# functions and under TYPE_CHECKING count too. Every package and top-level module of
# sluice.runtime is here: a new one must be given its floor.
RUNTIME = REPO / "runtime" / "src" / "sluice" / "runtime"
FLOORS = {
    "__init__": 0,
    "cache_dir": 0,  # below the leaves: the kernels' build cache and the models' share it
    # 1: leaves
    "constants": 1, "features": 1, "threads": 1, "dataclass_cli": 1, "disconnect": 1,
    "stop_match": 1, "memory": 1, "ipc": 1, "distributed": 1, "kernels": 1, "process_exit": 1,
    # 2: the types every layer reads, and the processes that need no model
    "forward": 2, "constrained": 2, "detokenizer": 2, "metrics": 2, "workload": 2, "router": 2,
    "disagg": 2,  # the KV transfer between a prefill and a decode server
    "attention": 3,
    "model": 4,
    "lora": 5,
    "engine": 6,
    "server_args": 7, "testing": 7,  # testing: test hooks, wired in by composition roots only
    "scheduler": 8, "entrypoints": 8,
    "supervisor": 8,  # the child processes' lifecycle, for launch
    "launch": 9, "sim": 9,
    "cli": 10,
    "__main__": 11,
}  # fmt: skip
# imports that still run up a floor, each to be removed (the list may only shrink; an entry
# that no longer exists fails the test too)
ALLOWED_UPWARD: set[tuple[str, str]] = set()
# modules past 500 lines say why at their top (the first lines of their docstring)
MAX_LINES = 500


def _runtime_modules() -> dict[str, Path]:
    modules = {}
    for path in RUNTIME.rglob("*.py"):
        parts = list(path.relative_to(RUNTIME.parent.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the runtime modules it imports (anywhere in its text)."""
    import ast

    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        edges[name] = found
    return edges


def _floor_name(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def _upward_imports() -> set[tuple[str, str]]:
    modules = _runtime_modules()
    bad = set()
    for source, targets in _imports(modules).items():
        for target in targets:
            a, b = _floor_name(source), _floor_name(target)
            if a != b and FLOORS[b] >= FLOORS[a]:
                bad.add((source, target))
    return bad


def test_every_runtime_package_has_a_floor():
    names = {_floor_name(m) for m in _runtime_modules()}
    assert names - set(FLOORS) == set(), "give the new package a floor in FLOORS"


def test_no_import_runs_up_a_floor():
    bad = _upward_imports()
    assert bad - ALLOWED_UPWARD == set()
    assert ALLOWED_UPWARD - bad == set(), "gone: remove it from ALLOWED_UPWARD"


def test_the_flags_are_read_only_by_composition_roots():
    """The engine and the API server keep their own record of the flags (`EngineConfig`,
    `ApiConfig`, read by name); only the roots that parse and hand them on import the type."""
    importers = {
        source
        for source, targets in _imports(_runtime_modules()).items()
        if _floor_name(source) != "server_args"
        and any(_floor_name(t) == "server_args" for t in targets)
    }
    assert {_floor_name(m) for m in importers} <= {"cli", "launch", "sim", "scheduler"}
    assert {m for m in importers if _floor_name(m) == "scheduler"} == TEST_HOOK_IMPORTERS


# the scheduler process's composition root: the only module that wires in the test hooks
TEST_HOOK_IMPORTERS = {"sluice.runtime.scheduler.process"}


def test_test_hooks_are_wired_in_only_by_the_composition_root():
    importers = {
        source
        for source, targets in _imports(_runtime_modules()).items()
        if _floor_name(source) != "testing" and any(_floor_name(t) == "testing" for t in targets)
    }
    assert importers == TEST_HOOK_IMPORTERS


def test_no_circle_of_files():
    edges = _imports(_runtime_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert circles == []


def test_a_module_past_500_lines_says_why_at_its_top():
    unexplained = []
    for name, path in _runtime_modules().items():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any("past 500 lines" in line.lower() for line in lines[:15]):
            unexplained.append(f"{name}: {len(lines)} lines")
    assert unexplained == []
