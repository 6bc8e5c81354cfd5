"""``tools/gpu_peer_check.py``, the tool that runs another project's own tests with and without
kcache, on tiny suites of its own: real pytest processes, real ``KCACHE=1`` children.

What is shown: a test whose outcome kcache changes is listed as a difference; a suite that cannot
even be collected (the first run of PyTorch's cache tests here lacked numpy) is reported as
"tested nothing" with the import error, exit 1, never as "no test's outcome differs"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "gpu_peer_check.py"


def run_tool(suite: Path, tmp: Path, *more: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(TOOL), "--suite", str(suite), "--modes", "plain,cold", "--out", "peer.json"]
    return subprocess.run([*cmd, *more], cwd=tmp, capture_output=True, text=True, timeout=300)


def test_a_test_that_kcache_changes_is_listed(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_few.py").write_text(
        "import os\n"
        "def test_same():\n    assert os.environ['KC_PLUGIN'] == 'on'\n"
        "def test_sees_kcache():\n    assert os.environ.get('KCACHE') != '1'\n"
    )
    (tmp_path / "plugins").mkdir()  # a pytest plugin of the suite, named by a relative --path
    (tmp_path / "plugins" / "kc_plugin.py").write_text(
        "import os\ndef pytest_configure(config):\n    os.environ['KC_PLUGIN'] = 'on'\n"
    )
    p = run_tool(suite, tmp_path, "--path", "plugins", "--", "-p", "kc_plugin")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cold   passed -> failed  test_few.py::test_sees_kcache" in p.stdout, p.stdout
    assert "test_same" not in p.stdout and "no test's outcome differs" not in p.stdout, p.stdout


def test_a_suite_that_cannot_be_collected_is_no_verdict(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_needs.py").write_text("import kcache_no_such_module\n\ndef test_x():\n    pass\n")
    p = run_tool(suite, tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "the plain run tested nothing" in p.stderr and "kcache_no_such_module" in p.stderr, p.stderr
    assert "no test's outcome differs" not in p.stdout, p.stdout
    assert "cold" not in p.stdout  # stopped at the first run that tested nothing
    saved = (tmp_path / "peer.json").read_text()  # what a user commits: no machine's paths
    assert "kcache_no_such_module" in saved and "<suite>" in saved, saved
    report = p.stderr[p.stderr.index("gpu_peer_check:") :]  # (torch's import may warn before it)
    for path in (str(tmp_path), sys.base_prefix, sys.prefix):
        assert path not in p.stdout + report + saved, path
