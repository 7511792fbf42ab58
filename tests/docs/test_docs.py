"""The docs: the README's links and test command, the generated config page, and the site.

The default suite checks what needs no builder: every relative link of the README and the
docs pages reaches a file, and every anchor a heading (anchors as GitHub makes them, which
mkdocs.yml gives the site too); the README's test command is the one CI runs; every docs page
is in the site's navigation; the config-key hook renders every key. `-m docs` builds the site
with `mkdocs build --strict`, serves it on localhost and loads its first page in headless
Chromium (a screenshot, the navigation and a code block); it skips, saying why, without
MkDocs or a browser.
"""
import functools
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose_lines(text: str):
    """The lines of a Markdown text outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def github_slug(heading: str) -> str:
    """A heading's anchor as GitHub (and the site's pymdownx.slugs) writes it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ...)."""
    seen, out = {}, set()
    for line in prose_lines(path.read_text()):
        match = re.match(r"#{1,6} +(.*?) *#*$", line)
        if match:
            slug = github_slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def broken_links(page: Path) -> list:
    problems = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):  # not in inline code
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                problems.append(f"{page.name}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{page.name}: {target}: no such heading")
    return problems


def test_the_readme_links_and_anchors_resolve():
    """GitHub shows the README; its links into docs/ must reach a page and a heading there
    (mkdocs build --strict checks the docs pages' own links, not the README's)."""
    assert broken_links(README) == []
    assert "docs/benchmarks.md#the-missions-command---auto_scale" in README.read_text()


def test_the_docs_pages_links_resolve():
    """The same check on the docs pages, without MkDocs (the strict build repeats it); the
    headings of api.md and config.md are made at build time, so anchors into them are
    checked by the build only."""
    generated = ("api.md#", "config.md#")
    problems = [p for page in sorted(DOCS.glob("*.md")) for p in broken_links(page)
                if not any(name in p for name in generated)]
    assert problems == []


def test_the_readme_test_command_is_what_ci_runs():
    readme = README.read_text()
    assert "```bash\npython -m pytest -q\n```" in readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(re.fullmatch(r"python -m pytest -q\s*(#.*)?", line) for line in ci)


def test_the_readme_is_a_landing_page():
    """The README is a landing page: short, the main command on its first screen, and no
    commit ids or dates (those live beside each figure in docs/benchmarks.md)."""
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 120, len(lines)
    main = lines.index("python -m gpusim.train --env tag_continuous --auto_scale")
    assert main < 40, main
    assert not re.findall(r"`[0-9a-f]{7,40}`|\b20\d\d-\d\d-\d\d\b", text)
    for page in ("getting-started.md", "training.md", "scaling.md", "environments.md",
                 "gpu.md", "troubleshooting.md", "benchmarks.md"):
        assert f"docs/{page}" in text, page
    why = text[text.index("## Why gpusim"):].split("\n## ")[0]
    rows = [line for line in why.splitlines() if line.startswith("| ") and "---" not in line]
    assert 1 <= len(rows) - 1 <= 5 and all("docs/benchmarks.md#" in r for r in rows[1:])


def test_every_docs_page_is_in_the_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", config, re.M))
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert pages == listed


def load_hook():
    spec = importlib.util.spec_from_file_location("config_keys_hook",
                                                  DOCS / "hooks" / "config_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_page_lists_every_key():
    """docs/config.md is filled at build time from training.run_config.config_reference():
    one table row per key line there, one heading per section."""
    from gpusim.training.run_config import config_reference

    hook = load_hook()
    reference = config_reference()
    markdown = hook.on_page_markdown((DOCS / "config.md").read_text(), page=None)
    assert hook.MARKER not in markdown
    keys = [line for line in reference.splitlines() if line.startswith("    ")]
    rows = [line for line in markdown.splitlines() if line.startswith("| `")]
    assert len(rows) == len(keys) > 100
    sections = [line for line in reference.splitlines() if re.match(r"  \S", line)]
    assert len(re.findall(r"^### ", markdown, re.M)) == len(sections)
    assert "| `num_envs` | `64` | env replicas per process |" in markdown
    assert "### env: tag_continuous" in markdown and "### trainer: sac keys" in markdown
    with pytest.raises(ValueError, match="unreadable line"):
        hook.config_markdown("config keys\neach with its default:\n  trainer:\n    what?\n")


# ---- the site, built and loaded in a browser (-m docs) -------------------------------------

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync")
QUIET = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def needs_builder():
    missing = [name for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")
               if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the docs builder is not installed ({', '.join(missing)} missing): "
                    "pip install -e '.[docs]'")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    needs_builder()
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(out)], cwd=ROOT, env=QUIET,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture()
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless browser installed (Debian: apt-get install -y chromium)")


def headless(tmp_path, name: str, *args) -> subprocess.CompletedProcess:
    """One run of the browser with a fresh profile of its own."""
    profile = tmp_path / f"profile-{name}"
    return subprocess.run([browser(), *BROWSER_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.docs
def test_the_site_builds_strict(site):
    for page in ("index.html", "getting-started/index.html", "config/index.html",
                 "api/index.html", "benchmarks/index.html", "changelog/index.html"):
        assert (site / page).is_file(), page
    config = (site / "config" / "index.html").read_text()
    assert "replay_size" in config and "max_num_envs" in config
    api = (site / "api" / "index.html").read_text()
    for name in ("gpusim.make", "gpusim.Env", "gpusim.check_env", "gpusim.ActionSampler",
                 "gpusim.wrappers.to_gymnasium", "gpusim.load_policies"):
        assert name in api, name


@pytest.mark.slow
@pytest.mark.docs
def test_the_first_page_renders_in_headless_chromium(served, tmp_path):
    shot = tmp_path / "first-page.png"
    done = headless(tmp_path, "shot", "--window-size=1280,900", f"--screenshot={shot}", served)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    done = headless(tmp_path, "dom", "--dump-dom", served)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    start, end = dom.find("md-nav--primary"), dom.find("md-sidebar--secondary")
    assert 0 <= start < end, "no navigation sidebar in the rendered page"
    navigation = {re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", link)).strip()
                  for link in re.findall(r'<a [^>]*class="md-nav__link[^"]*"[^>]*>(.*?)</a>',
                                         dom[start:end], re.S)}
    for item in ("Getting started", "Config keys", "Scaling", "Writing an environment",
                 "Interop", "GPU guide", "Troubleshooting", "API reference", "Benchmarks",
                 "Changelog"):
        assert item in navigation, (item, navigation)
    code = [re.sub(r"<[^>]+>", "", block)
            for block in re.findall(r"<pre[^>]*>(.*?)</pre>", dom, re.S)]
    assert any("python -m gpusim.train --env tag_continuous --auto_scale" in block
               for block in code), code
