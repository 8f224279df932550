"""Colab and Binder: the install cell and the badges, derived from ``pyproject.toml``.

The repository's address (``[project.urls] Repository``) and the package's version are written
once, in ``pyproject.toml``. `make release` derives from them:

* the install cell, the first code cell of every chapter: it installs this release of
  ``forge_course`` (``forge-course==<version>``, from ``[project] version``) where the package
  is missing (Colab) and does nothing where it is present (`make lab`, Binder);
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

# `%pip` installs into the kernel's own Python, and prints pip's output: Colab reads its
# "Successfully installed" line to offer a restart. The package asks for ranges that Colab's own
# packages meet (`torch>=2.3`, `ipywidgets>=7.6`), so on Colab it installs alone and nothing that
# Colab has already loaded changes; where something did change (an older or newer runtime), the
# cell compares the versions of the distributions this session had imported, before and after,
# and says to restart. The widget manager is enabled on every run, not only after an install: it
# lives in the kernel, and a restarted runtime keeps the package but starts a new kernel.
#
# The release comes from the package index, pinned to the notebook's own version
# (`forge-course==<version>`, the version in pyproject.toml). Not a git branch: a branch moves
# on while a learner's copy of a notebook stays; not a git tag: pip would clone the repository
# and build it on every Colab runtime, where a wheel from the index installs in seconds. The
# same pinned line also installs from a local folder (pip's `--find-links`), which is how the
# Colab-like test (tests/test_colab_runtime.py) runs this very cell for real.
INSTALL_CELL = """\
# Installs the course package where it is missing, as on Colab (Colab's PyTorch is kept).
# Where it is already installed (`make lab`, Binder), this cell does nothing.
try:
    import forge_course
except ModuleNotFoundError:
    import importlib
    import sys
    from importlib import metadata

    def installed(names):  # the installed version of each distribution (None: not installed)
        importlib.invalidate_caches()
        versions = {{}}
        for name in names:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = None
        return versions

    # What this session has already imported, by distribution: pip cannot change it in memory.
    owners = metadata.packages_distributions()
    imported = {{name.partition(".")[0] for name in list(sys.modules)}}
    before = installed({{dist for name in imported for dist in owners.get(name, [])}})
    %pip install "{requirement}"
    changed = sorted(d for d, v in installed(before).items() if v != before[d])
    if changed:
        print("The install changed", ", ".join(changed), "which this session had already loaded.")
        print("{restart}")

try:  # Colab draws the simulations' widgets only with its custom widget manager
    from google.colab import output

    output.enable_custom_widget_manager()
except ModuleNotFoundError:
    pass"""
RESTART = "Runtime → Restart session, then run this cell again."


def _project(repo: Path) -> dict:
    import tomllib  # Python 3.11+: only maintainers build the release

    return tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def repository_url(repo: Path = REPO) -> str:
    """The course's repository, as ``pyproject.toml`` gives it (``[project.urls] Repository``)."""
    return _project(repo)["urls"]["Repository"].rstrip("/")


def release_requirement(repo: Path = REPO) -> str:
    """What the install cell asks pip for: this very release, ``forge-course==<version>``."""
    project = _project(repo)
    return f"{project['name']}=={project['version']}"


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


def install_cell_source(requirement: str) -> str:
    """The install cell's code, installing ``requirement`` (a pip requirement) where missing."""
    return INSTALL_CELL.format(requirement=requirement, restart=RESTART)


def install_cell(requirement: str) -> nbformat.NotebookNode:
    """The chapter's first code cell: installs ``requirement`` where the package is missing.

    The ``colab-install`` tag tells the grader that this is not the chapter's set-up cell.
    """
    cell = nbformat.v4.new_code_cell(install_cell_source(requirement))
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
