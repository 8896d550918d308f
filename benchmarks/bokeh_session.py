"""A browser-like session of a served Panel page over HTTP and the Bokeh websocket, without a browser.

It speaks the protocol BokehJS speaks (``bokeh.protocol`` messages): an HTTP GET of the page
for its session token, then the websocket: ``PULL-DOC-REQ`` for the document, user events
sent as ``PATCH-DOC`` messages carrying the same ``MessageSent`` events a click makes in
Chromium (captured from a real page: ``selection-change`` for a table row, ``button_click``
for a button), and every ``PATCH-DOC`` the server sends applied to a plain mirror of the
models' attributes. Nothing is rendered: what it measures is the server's side of a click,
from the event leaving to the update arriving.

Used by ``benchmarks/bench_load.py`` to put 20 sessions on a 2-core machine without 20
Chromium renderers competing with the server for those cores.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.websocket import websocket_connect


def plain(value: Any) -> Any:
    """Bokeh's JSON encoding (maps, typed arrays, model refs) as plain Python values."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get("type")
    if kind == "map":
        return {plain(k): plain(v) for k, v in value.get("entries", [])}
    if kind == "ndarray":
        array = value["array"]
        if isinstance(array, dict) and array.get("type") == "bytes":
            import numpy as np

            data = array["data"]
            if not isinstance(data, str):  # sent as a binary buffer, which this mirror drops
                return None
            return np.frombuffer(base64.b64decode(data), dtype=value["dtype"]).tolist()
        return plain(array)
    if kind in ("object", "value", "number", "slice", "set", "bytes"):
        return value
    return {k: plain(v) for k, v in value.items()}


class BokehSession:
    """One page of ``url``: its models' attributes by id, updated by the server's patches."""

    def __init__(self, url: str):
        self.url = url.rstrip("/") + "/"
        self.models: dict[str, dict] = {}  # id -> {"name": ..., "attributes": {...}}
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future]] = []
        self._replies: dict[str, asyncio.Future] = {}
        self._ws = None
        self._reader: asyncio.Task | None = None
        self.errors: list[str] = []

    # -- connecting ----------------------------------------------------------------------
    async def open(self, timeout: float = 120.0) -> None:
        page = await AsyncHTTPClient().fetch(self.url, request_timeout=timeout)
        token = re.search(r'"token":"([^"]+)"', page.body.decode())
        if token is None:
            raise RuntimeError(f"{self.url} sent a page without a session token")
        ws_url = self.url.replace("http://", "ws://", 1) + "ws"
        self._ws = await websocket_connect(ws_url, subprotocols=["bokeh", token.group(1)],
                                           max_message_size=512 * 1024 * 1024, connect_timeout=timeout)
        ack = await self._read_message()
        if ack is None or ack[0]["msgtype"] != "ACK":
            raise RuntimeError(f"expected ACK from {ws_url}, got {ack and ack[0]}")
        msgid = await self._send("PULL-DOC-REQ", {})
        while True:  # patches sent before the reply describe the document it then sends whole
            msg = await asyncio.wait_for(self._read_message(), timeout)
            if msg is None:
                raise RuntimeError(f"{ws_url} closed before sending the document")
            header, content = msg
            if header["msgtype"] == "PULL-DOC-REPLY" and header.get("reqid") == msgid:
                break
            if header["msgtype"] == "ERROR":
                raise RuntimeError(f"{ws_url} refused the document request: {content}")
        for root in content["doc"]["roots"]:
            self._index(root)
        self._reader = asyncio.create_task(self._read_loop())
        # as BokehJS does once the page is built: Panel runs its onload callbacks and starts
        # syncing components (ESM ones included) on this event
        await self._send_events([{"kind": "MessageSent", "msg_type": "bokeh_event",
                                  "msg_data": {"type": "event", "name": "document_ready", "values": {"type": "map"}}}])

    async def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass

    # -- the document mirror -------------------------------------------------------------
    def _index(self, value: Any) -> None:
        """Record every model object inside ``value`` (the first time a model is sent, in full)."""
        if isinstance(value, list):
            for v in value:
                self._index(v)
        elif isinstance(value, dict):
            if value.get("type") == "object" and "id" in value:
                entry = self.models.setdefault(value["id"], {"name": value.get("name"), "attributes": {}})
                for k, v in (value.get("attributes") or {}).items():
                    entry["attributes"][k] = v
                    self._index(v)
            else:
                for v in value.values():
                    self._index(v)

    def find(self, css_class: str | None = None, name_endswith: str | None = None,
             where: Callable[[dict], bool] | None = None) -> list[str]:
        """Ids of models with ``css_class`` in their css_classes and/or a type name ending so."""
        out = []
        for mid, m in self.models.items():
            attrs = m["attributes"]
            if css_class is not None and css_class not in (attrs.get("css_classes") or []):
                continue
            if name_endswith is not None and not (m["name"] or "").endswith(name_endswith):
                continue
            if where is not None and not where(m):
                continue
            out.append(mid)
        return out

    def attr(self, model_id: str, name: str) -> Any:
        return plain(self.models[model_id]["attributes"].get(name))

    def ref(self, model_id: str, name: str) -> str | None:
        """The id of the model that attribute ``name`` of ``model_id`` refers to."""
        v = self.models[model_id]["attributes"].get(name)
        return v.get("id") if isinstance(v, dict) else None

    def _apply(self, events: list[dict]) -> None:
        for ev in events:
            kind = ev.get("kind")
            if kind == "ModelChanged":
                self._index(ev["new"])
                m = self.models.setdefault(ev["model"]["id"], {"name": None, "attributes": {}})
                m["attributes"][ev["attr"]] = ev["new"]
            elif kind == "ColumnDataChanged":  # {model, attr, data, cols}: these columns replaced
                new = ev.get("data", ev.get("new"))
                self._index(new)
                m = self.models.setdefault(ev["model"]["id"], {"name": None, "attributes": {}})
                data = plain(m["attributes"].get(ev.get("attr", "data"))) or {}
                data.update(plain(new))
                m["attributes"][ev.get("attr", "data")] = data
            elif kind == "ColumnsStreamed" or kind == "ColumnsPatched":
                m = self.models.get(ev["model"]["id"])
                if m is not None:  # rare here (the studio replaces data); mark the data as unknown
                    m["attributes"]["data"] = None
            elif kind == "RootAdded":
                self._index(ev.get("model"))
        for cond, fut in list(self._waiters):
            if not fut.done() and cond():
                fut.set_result(time.perf_counter())

    async def wait_for(self, cond: Callable[[], bool], timeout: float) -> float:
        """Wait until ``cond()`` holds after a patch (or now); the time it first held."""
        if cond():
            return time.perf_counter()
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((cond, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiters = [w for w in self._waiters if w[1] is not fut]

    # -- events --------------------------------------------------------------------------
    async def event(self, name: str, model_id: str, **values: Any) -> None:
        """A Bokeh UI event from the page (what BokehJS sends for a click)."""
        entries = [["model", {"id": model_id}], *[[k, v] for k, v in values.items()]]
        await self._send_events([{"kind": "MessageSent", "msg_type": "bokeh_event",
                                  "msg_data": {"type": "event", "name": name,
                                               "values": {"type": "map", "entries": entries}}}])

    async def change(self, model_id: str, attr: str, value: Any) -> None:
        """A property set in the page (a widget's value typed and left, say)."""
        self.models[model_id]["attributes"][attr] = value
        await self._send_events([{"kind": "ModelChanged", "model": {"id": model_id}, "attr": attr, "new": value}])

    async def _send_events(self, events: list[dict]) -> None:
        await self._send("PATCH-DOC", {"events": events})

    # -- wire ----------------------------------------------------------------------------
    async def _send(self, msgtype: str, content: dict) -> str:
        msgid = uuid.uuid4().hex.upper()
        for fragment in (json.dumps({"msgid": msgid, "msgtype": msgtype}), "{}", json.dumps(content)):
            await self._ws.write_message(fragment)
        return msgid

    async def _read_message(self) -> tuple[dict, dict] | None:
        """One whole message (header, content); its buffers are read and dropped."""
        frames = []
        while len(frames) < 3:
            f = await self._ws.read_message()
            if f is None:
                return None
            frames.append(f)
        header = json.loads(frames[0])
        for _ in range(2 * int(header.get("num_buffers", 0) or 0)):  # buffer header + payload
            if await self._ws.read_message() is None:
                return None
        return header, json.loads(frames[2])

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._read_message()
                if msg is None:
                    return
                header, content = msg
                if header["msgtype"] == "PATCH-DOC":
                    self._apply(content.get("events", []))
                elif header["msgtype"] == "ERROR":
                    self.errors.append(f"server error reply: {content.get('text', content)}"[:300])
        except Exception as exc:  # a message this mirror cannot read: an error of the run, not a hang
            self.errors.append(f"could not read a server message: {type(exc).__name__}: {exc}"[:300])
            for _, fut in self._waiters:
                if not fut.done():
                    fut.set_exception(RuntimeError(self.errors[-1]))
