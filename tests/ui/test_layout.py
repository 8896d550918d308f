"""The page as a first-time user meets it, in Chromium at the two laptop sizes: it fits (no
horizontal scroll anywhere, nothing past the right edge, sidebar open or closed), the sidebar
runs in the order of use with folded settings, and the page opens on something to read."""
import time

import pytest

from tests.ui.harness import set_sidebar, text, unfold

SIZES = [(1280, 800), (1440, 900)]

# Elements past the viewport's right edge that an ancestor does not clip, and elements that
# scroll sideways: the page's own overflow, a card's, a table's (walked through shadow roots).
OVERFLOW = """() => {
  const vw = document.documentElement.clientWidth, out = [];
  const clipped = el => {
    for (let a = el.parentElement || el.getRootNode().host; a; a = a.parentElement || (a.getRootNode && a.getRootNode().host)) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' && a.getBoundingClientRect().right <= vw + 1) return true;
    }
    return false;
  };
  const name = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ').join('.') : '');
  const walk = root => {
    for (const el of root.querySelectorAll('*')) {
      const r = el.getBoundingClientRect(), s = getComputedStyle(el);
      if (r.width > 0 && r.height > 0 && s.visibility !== 'hidden') {
        if (r.right > vw + 1 && !clipped(el)) out.push('past the edge: ' + name(el) + ' right=' + Math.round(r.right));
        if ((s.overflowX === 'auto' || s.overflowX === 'scroll') && el.scrollWidth > el.clientWidth + 2)
          out.push('scrolls sideways: ' + name(el) + ' ' + el.scrollWidth + '>' + el.clientWidth);
      }
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  if (document.documentElement.scrollWidth > vw + 1) out.push('the page scrolls sideways');
  return out;
}"""


def top(page, selector: str) -> float:
    return page.locator(selector).first.bounding_box()["y"]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_first_page_fits_and_reads_in_the_order_of_use(browser, server, size):
    ctx = browser.new_context(viewport={"width": size[0], "height": size[1]})
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    since = len(server.output())
    page.goto(server.url)
    page.wait_for_selector(".tabulator-row", timeout=60_000)
    # it opens on a rollout: the strip is filled, and its group holds right and wrong answers
    page.wait_for_selector(".token-strip .tok", timeout=30_000)
    # the rightmost token's hover card opens leftwards, inside the strip
    toks = page.locator(".token-strip .tok")
    rights = toks.evaluate_all("ts => ts.map(t => t.getBoundingClientRect().right)")
    last = toks.nth(rights.index(max(rights)))
    last.hover()
    card = last.locator(".card").bounding_box()
    strip = page.locator(".token-strip .clickable").first.bounding_box()
    assert card["x"] >= strip["x"] - 1 and card["x"] + card["width"] <= strip["x"] + strip["width"] + 1
    # the sidebar in the order of use: which rollouts, what the colours show, then generating;
    # the fork and advantage settings folded, Generate last
    order = [".store-info", ".table-filters", ".channel-picker", ".version-shown", ".fork-card", ".credit-card",
             ".generate-card"]
    ys = [top(page, s) for s in order]
    assert ys == sorted(ys), dict(zip(order, ys))
    assert not page.locator(".estimator").first.is_visible()  # folded until wanted
    unfold(page, "credit-card")
    page.locator(".estimator").first.wait_for(state="visible", timeout=10_000)
    assert not page.get_by_text("β (KL weight)").first.is_visible()  # GRPO has no β
    # the policy line names no guessed device; the backend line names the worker's own
    assert "CUDA if present" not in text(page.locator(".store-info"))
    deadline = time.time() + 90
    while "CPU" not in text(page.locator(".backend-status")) and time.time() < deadline:
        time.sleep(1)
    assert "CPU" in text(page.locator(".backend-status"))
    time.sleep(1)
    assert page.evaluate(OVERFLOW) == []
    set_sidebar(page, False)
    assert page.evaluate(OVERFLOW) == []
    ctx.close()
    assert not errors, errors
    assert not server.tracebacks(since), server.tracebacks(since)
