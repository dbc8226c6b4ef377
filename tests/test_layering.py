"""The house's import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and each can fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(config: Path | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is missing: `make install` installs import-linter")
    args = [exe, "--no-cache"] + ([] if config is None else ["--config", str(config)])
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_the_layering_contracts_hold() -> None:
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_room_of_the_service_is_in_the_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    rooms = {
        f"burstsched.{p.name}"
        for p in (ROOT / "burstsched").iterdir()
        if (p / "__init__.py").exists() and p.name not in {"sim", "testing", "workloads"}
    }
    assert rooms - {"burstsched.cli"} <= set(layers), sorted(rooms - set(layers))
    loose = sorted(p.name for p in (ROOT / "burstsched").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py"]


def test_a_lower_room_importing_a_higher_one_breaks_the_contract(tmp_path: Path) -> None:
    """Run the same contracts over a copy of the tree with one upward import added: lint-imports must fail."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "burstsched", tree / "burstsched", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        ROOT / "plugins" / "burstsched_plugins",
        tree / "burstsched_plugins",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    with (tree / "burstsched" / "framework" / "state.py").open("a") as f:
        f.write("\nfrom burstsched.front import app as _app  # noqa\n")
    config = tmp_path / ".importlinter.toml"
    config.write_text((ROOT / "pyproject.toml").read_text())
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None
    result = subprocess.run(
        [exe, "--no-cache", "--config", str(config)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(tree), "PATH": str(Path(sys.executable).parent)},
    )
    assert result.returncode != 0, result.stdout
    assert "burstsched.framework.state -> burstsched.front.app" in result.stdout
