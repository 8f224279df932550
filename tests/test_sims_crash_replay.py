"""The crash replay: real processes, one killed by SIGKILL, resumed to the same losses."""

import signal
import sys

import pytest

from forge_course.sims import crash_replay


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_and_resumed_process_reproduces_every_loss(tmp_path):
    result = crash_replay.replay(tmp_path, kill_at=13)
    assert result["returncode"] == -signal.SIGKILL
    assert result["resumed_from"] == 12
    assert max(result["killed"]) == 13
    assert min(result["resumed"]) == 13
    joined = {**result["killed"], **result["resumed"]}
    assert joined == result["uninterrupted"]
    assert len(joined) == crash_replay.EPOCHS * 10
    fig = crash_replay.draw_replay(result, 13)
    assert fig.axes[0].get_xlabel() == "optimizer step"
