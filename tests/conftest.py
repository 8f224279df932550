"""Shared fixtures: where the repository is, and the chapters that exist."""

from pathlib import Path

import pytest
import torch

from forge_course.release import chapter_ids

# Two xdist workers share two cores: more threads per worker would only contend.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = chapter_ids(REPO)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
