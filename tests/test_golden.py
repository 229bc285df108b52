"""Each stage's golden input, run through the real CLI, gives exactly its golden output."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "stages"))
import golden  # noqa: E402


@pytest.mark.parametrize("stage", sorted(golden.GOLDEN))
def test_golden(stage, tmp_path):
    result = golden.run(stage, tmp_path)
    assert result.returncode == 0, result.stderr
    for name in golden.GOLDEN[stage][1]:
        expected = (golden.STAGES / stage / name).read_bytes()
        assert (tmp_path / name).read_bytes() == expected, f"{stage}/{name} differs: run make golden if the change is intended"
