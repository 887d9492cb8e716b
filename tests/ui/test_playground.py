"""The playground in a real browser (`make test-ui`): Debian's Chromium, headless, driven by
Playwright against an in-process server over the tiny model and a scripted drafter.

What the page shows is checked against what the engine decided: each coloured span is one
token, its colour is the acceptor's verdict for it, the spans add up to the text the API
returns and their counts to `usage.speculation`. A screenshot goes to docs/img/.

Not in the default suite (marker `ui`): it needs /usr/bin/chromium and the `playwright`
package (`make test-ui` installs both). Waits use selectors, never `wait_for_function`:
the page's CSP forbids the eval that needs.
"""

from pathlib import Path

import httpx
import pytest

from scripted import K, decisions, scripted_engine, serving
from tiny_server import MODEL

pytestmark = pytest.mark.ui

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IMG = Path(__file__).parents[2] / "docs" / "img"
KEY = "sesame"
TIMEOUT_MS = 60_000

SPANS = """() => [...document.querySelectorAll('.run')].map(run => ({
  speculate: run.dataset.speculate,
  text: run.dataset.text,
  usage: JSON.parse(run.dataset.usage),
  tokens: [...run.querySelectorAll('.output .tok')].map(el => ({
    index: +el.dataset.index, source: el.dataset.source, kind: el.dataset.kind,
    step: +el.dataset.step, window: +el.dataset.window, text: el.textContent,
    background: getComputedStyle(el).backgroundColor,
  })),
  blocks: [...run.querySelectorAll('.output .accepted-run')].map(el => el.children.length),
  stats: Object.fromEntries(['tps', 'ntok', 'passes', 'mal', 'rate'].map(
    c => [c, run.querySelector('.' + c).textContent])),
}))"""


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (make test-ui installs it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def scripted():
    engine, acceptor = scripted_engine()
    with serving(engine) as url:
        yield url, acceptor


@pytest.fixture
def page(browser, scripted):
    """A fresh page on the scripted server; fails the test on any script error and on any
    request that leaves the server (the page must work offline)."""
    url, _ = scripted
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors, foreign = [], []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("request", lambda r: r.url.startswith((url, "data:")) or foreign.append(r.url))
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready=true]")
    yield page
    context.close()
    assert not errors, errors
    assert not foreign, foreign


def send(page, prompt: str, max_tokens: int, mode: str = "completion", compare=False):
    page.check(f"input[name=mode][value={mode}]")
    page.fill("#prompt", prompt)
    page.fill("#max_tokens", str(max_tokens))
    page.set_checked("#compare", compare)
    page.click("#send")
    last = "true" if compare or page.is_checked("#speculate") else "false"
    page.wait_for_selector(f".run[data-speculate={last}][data-done=true]", timeout=TIMEOUT_MS)
    page.wait_for_selector("body[data-busy=false]")
    return page.evaluate(SPANS)


def tokens_by_index(run: dict) -> list[dict]:
    """One entry per token (a span per token: a split token's text is joined in it)."""
    indices = [t["index"] for t in run["tokens"]]
    assert indices == list(range(len(indices))), indices
    return run["tokens"]


def expected_kinds(steps, n):
    kinds = ["plain"]
    for drafted, accepted in steps:
        own = "plain" if drafted == 0 else "bonus" if accepted == drafted else "recovered"
        kinds += ["accepted"] * accepted + [own]
    return kinds[:n]


def test_colours_are_the_engines_decisions(page, scripted):
    url, acceptor = scripted
    acceptor.log.clear()
    [run] = send(page, "Once upon a time", 48)
    steps = decisions(acceptor)  # before any other request reaches the engine
    tokens = tokens_by_index(run)

    # Each span's colour is the verdict of the acceptor for that token, in order.
    assert [t["kind"] for t in tokens] == expected_kinds(steps, len(tokens))
    assert all((t["source"] == "draft") == (t["kind"] == "accepted") for t in tokens)
    backgrounds = {s: {t["background"] for t in tokens if t["source"] == s} for s in ("draft",)}
    backgrounds["target"] = {t["background"] for t in tokens if t["source"] == "target"}
    assert len(backgrounds["draft"]) == len(backgrounds["target"]) == 1
    assert backgrounds["draft"] != backgrounds["target"]
    # An accepted run is one block: as many blocks as passes that kept a draft token.
    assert run["blocks"] == [a for d, a in steps if a]

    # The spans add up to the text the API returns, their counts to usage.speculation.
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}
    api = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    assert "".join(t["text"] for t in tokens) == run["text"] == api["choices"][0]["text"]
    for usage in (run["usage"], api["usage"]):
        spec = usage["speculation"]
        assert len(tokens) == usage["completion_tokens"] == 48
        assert sum(t["source"] == "draft" for t in tokens) == spec["accepted_tokens"]
        assert len({t["step"] for t in tokens if t["step"] > 0}) == spec["target_passes"]
        assert sum({t["step"]: t["window"] for t in tokens}.values()) == spec["drafted_tokens"]
    assert run["stats"]["ntok"] == "48"
    assert float(run["stats"]["mal"]) == pytest.approx(
        run["usage"]["speculation"]["mean_accepted_length"], abs=0.006
    )
    assert max(t["window"] for t in tokens) == K


def test_side_by_side_chat_and_a_screenshot(page):
    runs = send(page, "Write a story about a robot.", 40, mode="chat", compare=True)
    off, on = runs
    assert (off["speculate"], on["speculate"]) == ("false", "true")
    assert off["text"] == on["text"]  # greedy: the same text, at two speeds
    assert all(t["source"] == "target" for t in tokens_by_index(off))
    assert off["usage"]["speculation"]["drafted_tokens"] == 0
    assert off["usage"]["speculation"]["target_passes"] == 39
    assert sum(t["source"] == "draft" for t in tokens_by_index(on)) > 0
    assert page.locator(".speedup").count() == 1
    assert page.locator("#chat-log .msg").count() == 2  # the turn joined the conversation
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / "playground-tiny.png"), full_page=True)


def test_narrow_window_and_keyboard(page):
    page.set_viewport_size({"width": 360, "height": 740})
    page.check("input[name=mode][value=completion]")
    page.fill("#max_tokens", "12")
    page.focus("#prompt")
    page.keyboard.press("Control+A")
    page.keyboard.type("abc")
    page.keyboard.press("Control+Enter")  # sends without the mouse
    page.wait_for_selector(".run[data-done=true]", timeout=TIMEOUT_MS)
    page.wait_for_selector("body[data-busy=false]")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    # Every control is reachable with Tab, in a sensible order.
    page.focus("#prompt")
    reached = []
    for _ in range(14):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.id || document.activeElement.name"))
    for control in ("max_tokens", "temperature", "top_p", "top_k", "seed", "compare", "send"):
        assert control in reached, reached


def test_bad_settings_show_the_servers_error(page):
    page.check("input[name=mode][value=completion]")
    page.fill("#prompt", "abc")
    page.fill("#max_tokens", "100000")  # past the page's own limit: the browser refuses
    page.click("#send")
    assert page.locator(".run").count() == 0
    page.evaluate("document.querySelector('#max_tokens').removeAttribute('max')")
    page.click("#send")  # now the server refuses it: its OpenAI error shows
    page.wait_for_selector("#error:not([hidden])")
    assert "max_tokens" in page.inner_text("#error") or "context" in page.inner_text("#error")


def test_the_api_key_guards_the_page(browser):
    engine, _ = scripted_engine()
    with serving(engine, api_key=KEY) as url:
        assert httpx.get(url + "/v1/models").status_code == 401
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.locator("#compose").is_hidden()
        page.fill("#api-key", "wrong")
        page.click("#key-form button")
        page.wait_for_selector("#error:not([hidden])")
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready=true]")
        [run] = send(page, "abc", 8)
        assert run["usage"]["completion_tokens"] == 8
        page.close()
