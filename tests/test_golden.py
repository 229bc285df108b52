"""Each stage's golden input, run through the real CLI, gives exactly its golden output."""

from __future__ import annotations

import pytest

import golden


@pytest.mark.parametrize("stage", sorted(golden.GOLDEN))
def test_golden(stage, tmp_path):
    result = golden.run(stage, tmp_path)
    assert result.returncode == 0, result.stderr
    for name in golden.GOLDEN[stage][1]:
        expected = (golden.STAGES / stage / name).read_bytes()
        assert (tmp_path / name).read_bytes() == expected, f"{stage}/{name} differs: run make golden if the change is intended"
