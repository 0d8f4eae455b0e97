"""benchmarks/model_step.py --smoke: the engine's forward (tiny model, the attention `auto`
picks here) timed and traced, as scripts/device_check.sh runs it on a device."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import model_step  # noqa: E402


def test_smoke_step_reports_wall_and_device_busy_time(tmp_path, capsys):
    model_step.main(["--smoke", "--profile", str(tmp_path / "trace")])
    out = capsys.readouterr().out
    header = re.search(r"model step: 2 layers, .* (\d+) conditionals, (\d+) while loops", out)
    assert header, out
    wall = float(re.search(r"wall +([\d.]+) us/step", out).group(1))
    busy = [float(x) for x in re.findall(r"busy +([\d.]+) us/step", out)]
    assert wall > 0 and busy and max(busy) > 0
    assert "us/call" in out  # the costliest events of each timeline
