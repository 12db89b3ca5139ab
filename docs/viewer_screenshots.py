"""Take the screenshots of the viewer in docs/images/ (viewer-head.png, viewer-model.png,
viewer-matrix.png) from a real model run, with the same headless Chromium as the tests.

    python docs/viewer_screenshots.py [--model smollm2] [--text "..."] [--layer 5 --head 4]

The defaults show a classic question — does "it" attend to "animal"? — on SmolLM2, at
layer 13, head 8, the head where it does most (0.76 of its attention).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.browser import CHROMIUM, CHROMIUM_ARGS, READY  # noqa: E402

TEXT = "The animal didn't cross the road because it was too tired."
MAX_BYTES = 200_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--layer", type=int, default=13, help="layer for the head and matrix views")
    parser.add_argument("--head", type=int, default=8, help="head for the matrix view")
    parser.add_argument("--query", default="it", help="the matrix view's tooltip points at this query ...")
    parser.add_argument("--key", default="animal", help="... and this key")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from attnkit import models
    from attnkit.viz.viewer import viewer_data_from_run, write_html

    model = models.load(args.model)
    data = viewer_data_from_run(model, model.run(args.text, return_weights=True), name=args.model, text=args.text)
    layer = args.layer
    tokens = list(data.sections["self"].query_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        page_file = write_html(Path(tmp) / "viewer.html", data)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 760})
        page.goto(page_file.as_uri())
        page.wait_for_selector(READY)
        page.get_by_label("Layer", exact=True).select_option(label=f"layer {layer}")
        page.wait_for_selector(READY)
        page.hover(f"#ak-q-{tokens.index(args.query)}")
        shots = {"head": args.out / "viewer-head.png"}
        page.screenshot(path=shots["head"])
        page.mouse.move(1, 1)
        page.click("#ak-tab-model")
        page.wait_for_selector(READY)
        shots["model"] = args.out / "viewer-model.png"
        page.screenshot(path=shots["model"])
        page.get_by_role("button", name=f"layer {layer}, head {args.head}: open in the matrix view").click()
        page.wait_for_selector(READY)
        canvas = page.locator("#ak-matrix")
        box = canvas.bounding_box()
        cell, left, top = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell", "left", "top"))
        i, j = tokens.index(args.query), tokens.index(args.key)
        page.mouse.move(box["x"] + left + (j + 0.5) * cell, box["y"] + top + (i + 0.5) * cell)
        page.wait_for_selector("#ak-tooltip:not([hidden])")
        shots["matrix"] = args.out / "viewer-matrix.png"
        page.screenshot(path=shots["matrix"])
        browser.close()
    for name, path in shots.items():
        size = path.stat().st_size
        print(f"{name}: {path.relative_to(ROOT)} ({size / 1000:.0f} kB)")
        if size > MAX_BYTES:
            print(f"  over {MAX_BYTES / 1000:.0f} kB: use a smaller text or viewport", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
