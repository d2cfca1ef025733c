"""The front page and the docs: CI runs the README's test command verbatim, the page stays short, every relative
link resolves, and the package declares what the README's commands install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README_MONO_GPU.md"
PAGES = [ROOT / "README.md", README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path named in a page's text (a command to run, a file to read): bench/x.py, offline_host/x.sh ...
NAMED_PATH = re.compile(r"(?<![\w/.-])((?:bench|offline_host|rlt_mono|cfgs|tests|notebooks|docs)/[\w/.-]*\w"
                        r"\.(?:sh|py|yaml|ipynb|md))")


def _commands(text: str) -> list[str]:
    """The first line of every ```bash block."""
    return [block.splitlines()[0] for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = _commands(README.read_text())[1]
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_front_page_reads_in_five_minutes():
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", [*PAGES, ROOT / "offline_host" / "README.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_and_file_a_page_names_exists(page):
    missing = sorted({path for path in NAMED_PATH.findall(page.read_text()) if not (ROOT / path).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names files that are not in the repository: {missing}"


def test_a_moved_script_is_caught():
    assert NAMED_PATH.findall("then `bash bench/gpu_pipeline.sh fair` and rlt_mono/stages/x.py") == [
        "bench/gpu_pipeline.sh", "rlt_mono/stages/x.py"]


def test_no_page_points_into_the_old_results_folder():
    for page in PAGES:
        assert "bench/results" not in page.read_text(), page.name


def test_the_package_declares_the_readme_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {"cpu", "gpu", "dev"} <= set(project["optional-dependencies"])
    assert project["scripts"]["rlt-mono"] == "rlt_mono.__main__:main"
    for command in _commands(README.read_text()):
        for extras in re.findall(r'pip install (?:-q )?-e "\.\[([\w,]+)\]"', command):
            assert set(extras.split(",")) <= set(project["optional-dependencies"])
