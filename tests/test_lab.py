"""`make lab` serves JupyterLab with the course index and the chapters, over real HTTP."""

import json

import pytest

from tests.conftest import CHAPTERS, REPO
from tests.lab_server import get, lab


@pytest.mark.slow
def test_make_lab_serves_the_index_and_every_chapter(tmp_path):
    with lab(REPO, tmp_path) as base:
        page = get(f"{base}/lab").decode()
        assert "JupyterLab" in page
        index = json.loads(get(f"{base}/api/contents/notebooks/index.ipynb"))
        assert index["type"] == "notebook"
        for chapter in CHAPTERS:
            path = f"notebooks/{chapter}/{chapter}.ipynb"
            model = json.loads(get(f"{base}/api/contents/{path}"))
            assert model["content"]["cells"], f"{path} is empty"
