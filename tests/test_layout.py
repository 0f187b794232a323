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
