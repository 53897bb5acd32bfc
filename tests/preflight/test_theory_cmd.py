"""`grpokit theory` reproduces math.md section 5 and draws a real PNG."""

from __future__ import annotations

import struct
from pathlib import Path

from click.testing import CliRunner

from grpokit.cli import main


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_worked_values_and_png(tmp_path: Path) -> None:
    png = tmp_path / "h.png"
    result = CliRunner().invoke(
        main, ["theory", "--p-ref", "0.2", "--beta", "1.0", "--steps", "3", "--png", str(png)]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    # math.md: p_1 = 0.752818, p_2 = 0.717456, p_3 = 0.697359, p* = 0.6812992, h'(p*) = 0.389;
    # without std normalisation p* = 0.40461.
    for value in ("0.7528178577", "0.7174557107", "0.6973593051"):
        assert value in out
    assert "limit of the iteration from p_ref: p* = 0.6812992" in out
    assert "p* = 0.6812992" in out and "h'(p*) = +0.3891  stable" in out
    assert "unstable" in out  # the middle fixed point near 0.9347
    assert "p* = 0.40461" in out
    assert "not a promise" in out
    width, height = _png_size(png)
    assert 400 <= width <= 2000 and 300 <= height <= 2000
    assert png.stat().st_size > 15_000  # a drawn figure, not an empty canvas

    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    # Curves in several colours on white: many distinct pixel values.
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::7].tolist()}) > 50


def test_beta_0_1_and_beta_zero(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["theory", "--p-ref", "0.2", "--beta", "0.1", "--png", str(tmp_path / "a.png")]
    )
    assert result.exit_code == 0, result.output
    # p_1 = 1 - 5.56e-11, and p* = 1 to double precision.
    assert "5.556e-11" in result.output
    assert "limit of the iteration from p_ref: p* = 1.0000000" in result.output
    result = runner.invoke(main, ["theory", "--p-ref", "0.2", "--beta", "0"])
    assert result.exit_code == 2
    assert "degenerate" in result.output
