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


def test_a_waiting_resume_looks_for_its_checkpoint_only_once_told(tmp_path):
    """The replay starts the resume before the kill: it must not pick a checkpoint until then."""
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    with open(first / "losses.txt", "w") as log:
        crash_replay.train(first, log)  # checkpoints after steps 4, 8, …, 48
    newest = crash_replay.latest_checkpoint(first)

    def ready():  # what the killed run leaves, arriving while the resume waits
        (later / newest.name).write_bytes(newest.read_bytes())

    with open(later / "losses.txt", "w") as log:
        crash_replay.train(later, log, resume=True, ready=ready)
    resumed = crash_replay.read_losses(later / "losses.txt")
    assert min(resumed) == 49, "the resume started from the checkpoint that arrived while it waited"
    assert resumed == {
        step: crash_replay.read_losses(first / "losses.txt")[step] for step in (49, 50)
    }
