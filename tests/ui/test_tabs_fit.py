"""The lower tabs on a laptop's screen: every tab's header inside the page, reachable with the mouse,
and its view drawn when clicked; only the open tab's view in the page."""
from __future__ import annotations

import time

import pytest

from studio.face.tabs import TABS

from .harness import TAB_MARKERS, open_tab, set_sidebar, studio_page

pytestmark = pytest.mark.ui

TITLES = [tab.title for tab in TABS]

HEADERS = """() => {
  const tabs = document.querySelector('.lower-tabs');
  const r = tabs.getBoundingClientRect();
  return [{title: '(the tabs)', left: r.left, right: r.right, width: r.width}, ...[...tabs.shadowRoot.querySelectorAll('.bk-tab')].map(el => {
    const r = el.getBoundingClientRect();
    return {title: el.textContent, left: r.left, right: r.right, width: r.width};
  })];
}"""


def headers_inside(page) -> list[dict]:
    """The boxes of the tabs and their headers; asserts each is whole and inside the viewport's width."""
    width = page.viewport_size["width"]
    deadline = time.time() + 5  # (a resize or a sidebar moved: laid out again in the next frames)
    while True:
        boxes = page.evaluate(HEADERS)
        if all(b["left"] >= 0 and b["right"] <= width for b in boxes) or time.time() > deadline:
            break
        page.wait_for_timeout(200)
    assert [b["title"] for b in boxes] == ["(the tabs)", *TITLES]
    for b in boxes:
        assert b["left"] >= 0 and b["right"] <= width, f"{b['title']!r} runs past the page's right edge: {b}"
    return boxes


@pytest.mark.parametrize("size", [(1280, 800), (1440, 900)], ids=["1280x800", "1440x900"])
def test_every_tab_fits_and_opens_with_the_sidebar_open_or_closed(browser, server, size):
    with studio_page(browser, server) as page:
        page.set_viewport_size({"width": size[0], "height": size[1]})
        for sidebar in (True, False):
            set_sidebar(page, open=sidebar)
            headers_inside(page)
            for title in [*TITLES[1:], TITLES[0]]:  # a click where a person clicks: Playwright checks nothing covers it
                open_tab(page, title)
                headers_inside(page)  # a view drawn does not push the headers out


def test_only_the_open_tabs_view_is_in_the_page(page):
    """A tab left takes its view out of the browser's document (the page does not grow with every tab
    opened); opened again, its view is back, as it was left."""
    for title in TITLES[1:4]:
        open_tab(page, title)
        for other in TITLES[:4]:
            if other != title:
                assert page.locator(TAB_MARKERS[other]).count() == 0, f"{other}'s view is still in the page"
    open_tab(page, TITLES[0])
    assert page.locator(TAB_MARKERS[TITLES[3]]).count() == 0
    open_tab(page, TITLES[3])
    assert page.locator(TAB_MARKERS[TITLES[0]]).count() == 0
