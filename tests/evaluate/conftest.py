from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_run import make_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return make_run(tmp_path / "hackable")
