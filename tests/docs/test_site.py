"""The documentation site builds in strict mode (a broken link, a missing page or an API that is gone
fails it), its reference pages are generated from the code, and it works in a real browser, offline."""

from __future__ import annotations

import contextlib
import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
# as tests/runs/test_report.py: a fresh profile, no background traffic, and a proxy on a closed port, so a
# request the page made to anywhere but loopback (the site) would fail, and is logged either way
BROWSER_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--proxy-server=127.0.0.1:9",
                 "--disable-features=AutofillServerCommunication", "--virtual-time-budget=10000")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
                          cwd=config.parent)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = build(REPO / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


def text_of(page: Path) -> str:
    return re.sub(r"<[^>]+>", " ", page.read_text())


def test_the_reference_is_generated_from_the_code(site):
    import hybridflow
    from hybridflow.errors import ExitCode

    keys = text_of(site / "reference" / "pipeline-file.html")
    schema = hybridflow.schema()
    for key in [*schema["properties"], *schema["$defs"]["StageSpec"]["properties"]]:
        assert f"{key}" in keys, key
    assert "stages.&lt;name&gt;" in keys and "backends.spark" in keys
    codes = text_of(site / "reference" / "exit-codes.html")
    assert all(re.search(rf"\b{int(code)}\s+{code.name}\b", codes) for code in ExitCode)
    cli = text_of(site / "reference" / "cli.html")
    for command in ("hybridflow run", "hybridflow schedule install", "hybridflow clusters reap", "--keep-going"):
        assert command in cli, command
    api = (site / "reference" / "python-api.html").read_text()
    assert 'id="hybridflow.api.run"' in api and 'id="hybridflow.results.RunResult"' in api
    assert 'id="hybridflow.testing.BackendContract"' in (site / "reference" / "testing.html").read_text()
    assert "Int64" in text_of(site / "reference" / "parquet-contract.html")  # int64 with nulls, converted


def test_the_pipeline_reference_shows_every_key_with_its_example(site):
    from tests.docs.test_key_examples import reference

    page = html.unescape(text_of(site / "reference" / "pipeline-file.html"))
    missing = [path for path, example in reference.key_examples().items() if reference.flow(example) not in page]
    assert not missing, missing
    assert '{"address": "tcp://10.0.0.5:8786", ...}' in page  # a description's braces are text, not attributes


def test_a_broken_link_or_a_vanished_api_fails_the_strict_build(tmp_path):
    for fault, expected in ((("learn/tutorial.md", "[gone](no-such-page.md)"), "no-such-page.md"),
                            (("reference/testing.md", "::: hybridflow.testing.NoSuchThing"), "NoSuchThing")):
        copy = tmp_path / fault[0].replace("/", "-")
        shutil.copytree(REPO / "docs", copy / "docs")
        shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
        page = copy / "docs" / fault[0]
        page.write_text(page.read_text() + f"\n\n{fault[1]}\n")
        (copy / "hybridflow").symlink_to(REPO / "hybridflow")  # mkdocstrings reads the package from here
        done = build(copy / "mkdocs.yml", copy / "site")
        assert done.returncode != 0 and expected in done.stdout + done.stderr, done.stderr[-2000:]


@contextlib.contextmanager
def served(site: Path):
    """The site over HTTP on loopback (search runs in a web worker, which a file:// page cannot start)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def dom_of(url: str, tmp: Path) -> tuple[str, list[str]]:
    """The page's DOM once its scripts ran in headless Chromium, and the URLs the page itself requested."""
    net = tmp / f"net-{abs(hash(url))}.json"
    done = subprocess.run([BROWSER, *BROWSER_FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--log-net-log={net}",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    log = json.loads(net.read_text())
    start_job = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requested = [e["params"]["url"] for e in log["events"] if e["type"] == start_job and "url" in e.get("params", {})
                 and "127.0.0.1" in str(e["params"].get("network_isolation_key", ""))]  # the page's own
    return done.stdout, requested


@pytest.mark.skipif(BROWSER is None, reason="Chromium is not installed (apt-get install chromium; .ci/run does)")
def test_home_tutorial_and_pipeline_reference_render_with_navigation_and_search_offline(site, tmp_path):
    with served(site) as base:
        for page, heading in (("index.html", "hybridflow"), ("learn/tutorial.html", "Tutorial"),
                              ("reference/pipeline-file.html", "The pipeline file")):
            dom, requested = dom_of(f"{base}/{page}", tmp_path)
            assert f">{heading}" in dom, page
            assert 'class="md-tabs' in dom and 'href="' in dom.split('class="md-tabs', 1)[1][:4000], page
            assert all(link in dom for link in ("Learn", "Guides", "Reference", "Explanations", "Benchmarks"))
            assert 'class="md-search__input' in dom, page
            elsewhere = [url for url in requested if not url.startswith(base)]
            assert elsewhere == [], f"{page} fetched {elsewhere}"


@pytest.mark.skipif(BROWSER is None, reason="Chromium is not installed (apt-get install chromium; .ci/run does)")
def test_a_query_typed_into_the_search_box_lists_the_page_that_answers_it_and_opens_it(site, tmp_path):
    from tests.docs.browser import Browser

    browser = Browser(BROWSER, BROWSER_FLAGS[:-1], tmp_path / "profile")  # no virtual time: the search worker runs
    try:
        with served(site) as base:
            browser.open(f"{base}/index.html")
            browser.click("label.md-header__button[for='__search']")  # the magnifier, as on a phone or a desktop
            browser.wait_for("document.activeElement.classList.contains('md-search__input')")
            browser.type("incremental")
            assert browser.evaluate("document.querySelector('.md-search__input').value") == "incremental"
            links = browser.wait_for("""(() => { const found = [...document.querySelectorAll(
                '.md-search-result__link')].map(a => a.getAttribute('href'));
                return found.some(href => href.includes('explanations/skipping.html')) && found; })()""")
            assert any("reference/pipeline-file.html" in link for link in links), links
            browser.click(".md-search-result__link[href*='explanations/skipping.html']")
            heading = browser.wait_for("location.pathname.endsWith('/explanations/skipping.html') && "
                                       "document.querySelector('h1') && document.querySelector('h1').textContent")
            assert heading.startswith("How skipping decides"), heading
    finally:
        browser.close()
