"""Screenshot the playground of a running `specdec serve` (the README's picture).

    .venv/bin/specdec serve --model qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-0.5b-instruct --port 8000 &
    .venv/bin/python scripts/playground_screenshot.py --url http://127.0.0.1:8000 \
        --out docs/img/playground.png

Drives Debian's Chromium headless through Playwright (`pip install -e '.[ui]'`, never
`playwright install`): sends one prompt with speculation off, then on, and saves the page.
"""

from __future__ import annotations

import argparse

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (its root)")
    p.add_argument("--prompt", default="Write a Python function that merges two sorted lists.")
    p.add_argument("--mode", default="chat", choices=["chat", "completion"])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--single", action="store_true", help="one run (speculation on) only")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--out", default="docs/img/playground.png")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": args.width, "height": 900})
        page.goto(args.url.rstrip("/") + "/")
        page.wait_for_selector("body[data-ready=true]")
        page.check(f"input[name=mode][value={args.mode}]")
        page.fill("#prompt", args.prompt)
        page.fill("#max_tokens", str(args.max_tokens))
        page.set_checked("#compare", not args.single)
        page.click("#send")
        page.wait_for_selector(".run[data-speculate=true][data-done=true]", timeout=600_000)
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
