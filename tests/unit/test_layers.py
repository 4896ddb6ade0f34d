"""The layers are enforced by import-linter (``make lint``): the real tree keeps every
contract, and a deliberate violation in a copy of it breaks the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

LINT = Path(sys.executable).parent / "lint-imports"


def _lint(src: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not LINT.exists():
        pytest.skip("import-linter is a dev/test extra: pip install -e '.[test]'")
    work = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    return work


def test_the_tree_keeps_every_contract(copy: Path) -> None:
    done = _lint(copy / "src", copy)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("core/model.py", "import agent_reach.gateway.router", "core is pure"),
        ("registry/memory.py", "import agent_reach.gateway.node", "never import the gateway"),
        ("sdk/context.py", "import agent_reach.edges.http.app", "never import the gateway"),
        ("edges/http/openapi.py", "import agent_reach.gateway.router", "edges import the node"),
        ("gateway/router.py", "import agent_reach.cli.main", "the gateway never imports"),
    ],
)
def test_a_deliberate_violation_breaks_the_build(
    copy: Path, module: str, line: str, contract: str
) -> None:
    target = copy / "src" / "agent_reach" / module
    original = target.read_text()
    try:
        target.write_text(f"{original}\n{line}  # noqa\n")
        done = _lint(copy / "src", copy)
    finally:
        target.write_text(original)
    assert done.returncode != 0, done.stdout[-3000:]
    report = " ".join(done.stdout.split())  # contract names wrap in the report
    broken = [part.rsplit(" KEPT", 1)[-1] for part in report.split(" BROKEN")[:-1]]
    assert any(contract in part for part in broken), done.stdout[-3000:]
