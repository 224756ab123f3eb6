"""What `pip install` of a source distribution builds from."""
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_sdist_holds_every_package_source_and_no_build_record(tmp_path):
    """Each tracked file of the package (Python, C++, CUDA) is in the sdist; the build record of the tree it was
    made in (`_build_info.json`, written by a build) is not, since it describes another machine's build."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout, whose tracked files are the sources")
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tree = tmp_path / "tree"
    for name in tracked:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    (tree / "scaled_mask_softmax" / "_build_info.json").write_text('{"cuda": true}\n')  # as a build leaves it
    finished = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], cwd=tree,
                              env={**os.environ, "SCALED_MASK_SOFTMAX_CPU_ONLY": "1"}, capture_output=True,
                              text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    [sdist] = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    package_sources = {name for name in tracked if name.startswith("scaled_mask_softmax/")}
    assert package_sources - names == set()
    assert {"setup.py", "pyproject.toml", "README.md", "LICENSE"} <= names
    assert "scaled_mask_softmax/_build_info.json" not in names
