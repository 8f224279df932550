"""Colab and Binder: the install cell and the badges, all derived from one address.

The repository's address is written once, in ``pyproject.toml`` (``[project.urls]
Repository``). `make release` derives from it everything that points at the repository:

* the install cell, the first code cell of every chapter: it installs ``forge_course`` where
  the package is missing (Colab) and does nothing where it is present (`make lab`, Binder);
* the "Open in Colab" badge under each chapter's title and in the course index;
* the badges block of ``README.md`` (Colab and Binder, both opening the course index).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import nbformat

from forge_course.grader.assignment import INSTALL_TAG

REPO = Path(__file__).resolve().parent.parent
BRANCH = "main"  # the branch that Colab and Binder open
INDEX = "notebooks/index.ipynb"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
README_BLOCK = re.compile(r"(<!-- badges -->\n).*?(<!-- /badges -->)", re.DOTALL)

# `%pip` installs into the kernel's own Python. The package asks for `torch>=2.3`, a range, so
# Colab's PyTorch (and its CUDA build) stays. The widget manager is enabled on every run, not
# only after an install: it lives in the kernel, and a restarted runtime keeps the package but
# starts a new kernel.
INSTALL_CELL = """\
# Installs the course package where it is missing, as on Colab (Colab's PyTorch is kept).
# Where it is already installed (`make lab`, Binder), this cell does nothing.
try:
    import forge_course
except ModuleNotFoundError:
    %pip install -q "forge-course @ git+{url}"

try:  # Colab draws the simulations' widgets only with its custom widget manager
    from google.colab import output

    output.enable_custom_widget_manager()
except ModuleNotFoundError:
    pass"""


def repository_url(repo: Path = REPO) -> str:
    """The course's repository, as ``pyproject.toml`` gives it (``[project.urls] Repository``)."""
    import tomllib  # Python 3.11+: only maintainers build the release

    project = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["urls"]["Repository"].rstrip("/")


def github_name(url: str) -> str:
    """``owner/name`` of a GitHub repository's address: how Colab and Binder find it."""
    parsed = urlparse(url)
    parts = parsed.path.strip("/").removesuffix(".git").split("/")
    if parsed.netloc != "github.com" or len(parts) != 2:
        raise ValueError(
            f"Colab and Binder open GitHub repositories; {url!r} is not "
            "https://github.com/<owner>/<name>. Fix [project.urls] Repository in pyproject.toml."
        )
    return "/".join(parts)


def colab_url(url: str, path: str) -> str:
    """Colab's address for the notebook at ``path`` (relative to the repository root)."""
    return f"https://colab.research.google.com/github/{github_name(url)}/blob/{BRANCH}/{path}"


def binder_url(url: str, path: str = INDEX) -> str:
    """mybinder.org's address that builds the repository and opens ``path`` in JupyterLab."""
    return f"https://mybinder.org/v2/gh/{github_name(url)}/{BRANCH}?urlpath=lab/tree/{path}"


def colab_badge(url: str, path: str) -> str:
    """The Markdown "Open in Colab" badge for the notebook at ``path``."""
    return f"[![Open In Colab]({COLAB_BADGE})]({colab_url(url, path)})"


def with_badge(markdown: str, badge: str) -> str:
    """``markdown`` with ``badge`` as a paragraph of its own under its title line."""
    title, _, rest = markdown.partition("\n")
    if not title.startswith("#"):
        return f"{badge}\n\n{markdown}"
    return "\n\n".join(part for part in (title, badge, rest.lstrip("\n")) if part)


def install_cell(url: str) -> nbformat.NotebookNode:
    """The chapter's first code cell: installs the package from ``url`` where it is missing.

    The ``colab-install`` tag tells the grader that this is not the chapter's set-up cell.
    """
    cell = nbformat.v4.new_code_cell(INSTALL_CELL.format(url=url))
    cell.id = INSTALL_TAG
    cell.metadata = {"tags": [INSTALL_TAG]}
    return cell


def readme_badges(url: str) -> str:
    """The README's badges: the course index on Colab and on Binder."""
    return "\n".join(
        [
            colab_badge(url, INDEX),
            f"[![Binder]({BINDER_BADGE})]({binder_url(url)})",
        ]
    )


def with_readme_badges(readme: str, url: str) -> str:
    """``readme`` with its ``<!-- badges -->`` … ``<!-- /badges -->`` block written for ``url``."""
    if not README_BLOCK.search(readme):
        raise ValueError("README.md has no <!-- badges --> … <!-- /badges --> block to fill in")
    return README_BLOCK.sub(lambda m: f"{m[1]}{readme_badges(url)}\n{m[2]}", readme, count=1)


def update_readme(repo: Path = REPO) -> None:
    """Rewrite the badges block of ``README.md`` from ``pyproject.toml`` (`make release` does)."""
    path = repo / "README.md"
    text = path.read_text(encoding="utf-8")
    new = with_readme_badges(text, repository_url(repo))
    if new != text:
        path.write_text(new, encoding="utf-8")
