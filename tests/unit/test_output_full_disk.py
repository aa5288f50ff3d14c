"""A replica's log that cannot be written (a full disk) costs the log, never supervision."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.backends import output
from trainguard.backends.output import RunOutput


def test_a_full_disk_keeps_the_tail_and_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    output._warned.clear()
    seen: list[bool] = []
    # writes fail with ENOSPC
    out = RunOutput("worker-0", Path("/dev/full"), None, lambda first, _s: seen.append(first))
    for i in range(50):
        out.feed(f"step {i} loss 0.1\n".encode())
    out.close()
    assert out.tail.lines()[-1] == "step 49 loss 0.1" and seen[0] is True
    err = capsys.readouterr().err
    assert err.count("cannot write replica logs") == 1, err
    assert "No space left on device" in err and "supervising on" in err


def test_the_log_comes_back_when_it_can_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output._warned.clear()
    monkeypatch.setattr(output, "LOG_RETRY_S", 0.0)
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the folder should be")
    log = blocker / "attempt-0" / "worker-0.log"
    out = RunOutput("worker-0", log, None, lambda _first, _segments: None)
    out.feed(b"lost line\n")
    blocker.unlink()  # space is back
    out.feed(b"kept line\n")
    out.close()
    assert log.read_text() == "\n[trainguard: 10 bytes of output not written here]\nkept line\n"
