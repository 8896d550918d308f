"""HTML views that talk to Python: ``ClickableHTML`` reports clicks on marked elements,
``MarkedHTML`` highlights one element of its HTML without sending the HTML again,
``KeyShortcuts`` reports single-key presses on the page.

Elements with ``data-click="<kind>"`` and ``data-value="<value>"`` send ``(kind, value)``
to the callbacks registered with :meth:`ClickableHTML.on_click`. The HTML itself is built
by the views (every model or user string escaped with ``widgets.base.style.esc``); the script
below only forwards clicks and never evaluates content. It needs no network: the module
is served inline by Panel.
"""
from __future__ import annotations

from collections.abc import Callable

import panel as pn
import param


class ClickableHTML(pn.custom.JSComponent):
    """Like ``pn.pane.HTML``, plus clicks on ``[data-click]`` elements (and hover cards of
    ``.tok`` elements kept inside the view: one that would pass its right edge opens leftwards)."""

    object = param.String(default="", doc="The HTML to show (already escaped by the caller).")

    _esm = """
export function render({ model, el }) {
  const box = document.createElement('div');
  box.className = 'clickable';
  box.innerHTML = model.object;
  model.on('object', () => { box.innerHTML = model.object; });
  box.addEventListener('click', (ev) => {
    const t = ev.target.closest('[data-click]');
    if (t && box.contains(t)) {
      model.send_msg({kind: t.dataset.click, value: t.dataset.value || ''});
    }
  });
  // a token's hover card opens leftwards where it would pass the view's right edge
  box.addEventListener('mouseover', (ev) => {
    const tok = ev.target.closest('.tok');
    const card = tok && tok.querySelector('.card');
    if (!card || !box.contains(tok)) return;
    const room = box.getBoundingClientRect().right - tok.getBoundingClientRect().left;
    tok.classList.toggle('card-left', room < Math.max(card.offsetWidth, 240));
  });
  el.appendChild(box);
}
"""

    def __init__(self, **params):
        super().__init__(**params)
        self._callbacks: list[Callable[[str, str], None]] = []

    def on_click(self, callback: Callable[[str, str], None]) -> None:
        """Call ``callback(kind, value)`` on every click of a ``[data-click]`` element."""
        self._callbacks.append(callback)

    def _handle_msg(self, msg) -> None:
        if not isinstance(msg, dict):
            return
        kind, value = str(msg.get("kind", "")), str(msg.get("value", ""))
        for cb in self._callbacks:
            cb(kind, value)


class MarkedHTML(pn.custom.JSComponent):
    """Like ``pn.pane.HTML``, plus one element marked: the element whose ``data-mark`` equals
    :attr:`marked` gets the class ``selected``. Changing only ``marked`` sends only the id, and
    the browser moves the class (a click within a group view's cards: not the cards again)."""

    object = param.String(default="", doc="The HTML to show (already escaped by the caller).")
    marked = param.String(default="", doc="The data-mark value of the element to mark ('' = none).")

    _esm = """
export function render({ model, el }) {
  const box = document.createElement('div');
  const mark = () => {
    for (const e of box.querySelectorAll('[data-mark].selected')) e.classList.remove('selected');
    for (const e of box.querySelectorAll('[data-mark]')) {
      if (model.marked && e.dataset.mark === model.marked) e.classList.add('selected');
    }
  };
  box.innerHTML = model.object;
  mark();
  model.on('object', () => { box.innerHTML = model.object; mark(); });
  model.on('marked', mark);
  el.appendChild(box);
}
"""


class KeyShortcuts(pn.custom.JSComponent):
    """Single-key presses on the page, sent to Python while this element is on screen and
    the focus is not in a text field (the note box, the sidebar's inputs)."""

    keys = param.String(default="", doc="The keys that are reported (→ is j, ← is k).")
    hint = param.String(default="", doc="The HTML shown (the key legend, escaped by the caller).")

    _esm = """
export function render({ model, el }) {
  const box = document.createElement('div');
  box.innerHTML = model.hint;
  model.on('hint', () => { box.innerHTML = model.hint; });
  el.appendChild(box);
  const onKey = (ev) => {
    const t = (ev.composedPath && ev.composedPath()[0]) || ev.target;
    const tag = ((t && t.tagName) || '').toLowerCase();
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (t && t.isContentEditable)) return;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    let k = ev.key;
    if (k === 'ArrowRight') k = 'j';
    if (k === 'ArrowLeft') k = 'k';
    if (k.length !== 1 || !model.keys.includes(k)) return;
    if (!box.isConnected || box.getClientRects().length === 0) return;  // a hidden tab: not ours
    ev.preventDefault();
    model.send_msg({key: k});
  };
  document.addEventListener('keydown', onKey);
  model.on('remove', () => document.removeEventListener('keydown', onKey));
}
"""

    def __init__(self, **params):
        super().__init__(**params)
        self._callbacks = []

    def on_key(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(key)`` on every press of one of :attr:`keys`."""
        self._callbacks.append(callback)

    def _handle_msg(self, msg) -> None:
        key = str(msg.get("key", "")) if isinstance(msg, dict) else ""
        if key in self.keys:
            for cb in self._callbacks:
                cb(key)
