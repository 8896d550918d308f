r"""Chat messages, and chat-templated strings read back into them.

An imported run often logs a prompt as the policy saw it, a chat template already applied
(verl's ``input``). :func:`parse_templated` reads the messages back out of the templates in
common use, so the store keeps the conversation (``prompts.messages``, its last user message
as ``prompts.text``) apart from the exact string (``rollouts.prompt_text``), and an export
never hands a trainer a templated string to template again::

    >>> s = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    ...      "<|im_start|>assistant\n")
    >>> parse_templated(s)
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]
    >>> last_user(parse_templated(s)), parse_templated("2+2?")
    ('2+2?', None)

Templates read: ChatML (Qwen, SmolLM, Hermes, …), Llama 3, Gemma, Phi-3 / Zephyr
(``<|user|>``), DeepSeek (``<｜User｜>``) and Llama 2 / Mistral (``[INST]``). The generation
prompt (an open assistant turn with nothing in it, or only an empty ``<think>`` block) is not
a message; an open assistant turn with text in it (a prefill) is kept as the last message.
A string none of them reads cleanly gives ``None``: it is kept as text.
"""
from __future__ import annotations

import re
from typing import Any

# markers that close a turn: a completion logged with one at its end has it cut in a chat export
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<｜end▁of▁sentence｜>", "</s>",
               "<|endoftext|>")
_BOS = re.compile(r"^(?:\s|<\|begin_of_text\|>|<bos>|<s>|<\|endoftext\|>|<｜begin▁of▁sentence｜>)*")
_EMPTY_THINK = re.compile(r"^\s*(?:<think>\s*(?:</think>)?)?\s*$")
_ROLES = {"model": "assistant", "User": "user", "Assistant": "assistant"}


def content_text(message: dict) -> str:
    """A message's content as text: content blocks (multimodal) give their text, other blocks a mark.

    >>> content_text({"role": "user", "content": [{"type": "text", "text": "What is "},
    ...                                           {"type": "image"}, {"type": "text", "text": "?"}]})
    'What is <image>?'
    """
    c = message.get("content")
    if isinstance(c, list):
        return "".join(b.get("text") or "" if b.get("type", "text") == "text" else f"<{b.get('type')}>"
                       for b in c if isinstance(b, dict))
    return "" if c is None else str(c)


def plain_messages(messages: list[Any]) -> list[dict[str, str]]:
    """``{role, content}`` with text content, other keys dropped (the shape TRL and the store take).

    >>> plain_messages([{"role": "user", "content": "hi", "name": "ann"}, {"content": None}])
    [{'role': 'user', 'content': 'hi'}, {'role': '', 'content': ''}]
    """
    return [{"role": str(m.get("role") or ""), "content": content_text(m)} for m in messages if isinstance(m, dict)]


def last_user(messages: list[dict]) -> str:
    """The last user message's content (the prompt's text), else the last message's.

    >>> last_user([{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
    ...            {"role": "assistant", "content": "a"}])
    'q'
    """
    users = [m for m in messages if m.get("role") == "user"]
    return content_text(users[-1]) if users else (content_text(messages[-1]) if messages else "")


def _turns(text: str, header: str, ends: tuple[str, ...], lead_role: str | None = None) -> list[dict] | None:
    """Messages of a template whose turns open with ``header`` (a regex whose group 1 is the
    role) and close with one of ``ends``; text before the first turn (after a BOS token) is a
    ``lead_role`` message, or makes the string unreadable."""
    heads = list(re.finditer(header, text))
    if not heads:
        return None
    lead = _BOS.sub("", text[:heads[0].start()])
    out: list[dict] = []
    if lead.strip():
        if lead_role is None:
            return None
        out.append({"role": lead_role, "content": lead})
    for h, nxt in zip(heads, heads[1:] + [None], strict=True):
        body = text[h.end(): nxt.start() if nxt is not None else len(text)]
        cut = min((k for k in (body.find(e) for e in ends) if k >= 0), default=-1)
        role = _ROLES.get(h.group(1), h.group(1))
        if cut >= 0:
            rest = body[cut:]
            for e in ends:
                rest = rest.replace(e, "")
            if rest.strip():  # text between a turn's end and the next turn: not this template
                return None
            body = body[:cut]
        elif nxt is None and role == "assistant" and _EMPTY_THINK.match(body):
            continue  # the generation prompt
        out.append({"role": role, "content": body})
    return out or None


def _inst(text: str) -> list[dict] | None:
    """Llama 2 / Mistral: ``<s>[INST] <<SYS>>\\nsystem\\n<</SYS>>\\n\\nuser [/INST] answer</s>``."""
    turns = list(re.finditer(r"\[INST\](.*?)\[/INST\]", text, re.S))
    if not turns:
        return None
    lead = _BOS.sub("", text[:turns[0].start()])
    out: list[dict] = []
    sp = re.fullmatch(r"\s*\[SYSTEM_PROMPT\](.*?)\[/SYSTEM_PROMPT\]\s*", lead, re.S)
    if sp:
        out.append({"role": "system", "content": sp.group(1).strip()})
    elif lead.strip():
        return None
    for t, nxt in zip(turns, turns[1:] + [None], strict=True):
        user = t.group(1).strip()
        sys = re.fullmatch(r"<<SYS>>\n?(.*?)\n?<</SYS>>\s*(.*)", user, re.S)
        if sys:
            out.append({"role": "system", "content": sys.group(1)})
            user = sys.group(2)
        out.append({"role": "user", "content": user})
        answer = text[t.end(): nxt.start() if nxt is not None else len(text)]
        answer = answer.replace("</s>", "").replace("<s>", "").strip()
        if answer:
            out.append({"role": "assistant", "content": answer})
    return out


_FAMILIES = (  # (a marker that names the family, how to read it)
    ("<|im_start|>", lambda s: _turns(s, r"<\|im_start\|>([^\n<]*)\n", ("<|im_end|>",))),
    ("<|start_header_id|>", lambda s: _turns(s, r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n",
                                             ("<|eot_id|>", "<|eom_id|>"))),
    ("<start_of_turn>", lambda s: _turns(s, r"<start_of_turn>(\w+)\n", ("<end_of_turn>",))),
    ("<｜User｜>", lambda s: _turns(s, r"<｜(User|Assistant)｜>", ("<｜end▁of▁sentence｜>",), lead_role="system")),
    ("<|user|>", lambda s: _turns(s, r"<\|(system|user|assistant)\|>\n?", ("<|end|>", "</s>"))),
    ("[INST]", _inst),
)


MARKERS = tuple(marker for marker, _ in _FAMILIES)  # a string with none of them is read as text


def chat_key(messages: list[dict]) -> str:
    """Which conversation ``messages`` are, as one string (an import groups and names prompts by it).

    >>> chat_key([{"role": "user", "content": "hi"}]) == chat_key([{"role": "user", "content": "hi"}])
    True
    """
    return "\x1d" + "\x1e".join(f"{m.get('role') or ''}\x1f{content_text(m)}" for m in messages)


def parse_templated(text: str) -> list[dict[str, str]] | None:
    """The messages a chat template rendered into ``text``; ``None`` when it reads as no known template.

    >>> parse_templated("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\nHi<|eot_id|>"
    ...                 "<|start_header_id|>assistant<|end_header_id|>\\n\\n")
    [{'role': 'user', 'content': 'Hi'}]
    >>> parse_templated("<bos><start_of_turn>user\\nHi<end_of_turn>\\n<start_of_turn>model\\nHello<end_of_turn>\\n"
    ...                 "<start_of_turn>model\\n")
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello'}]
    >>> parse_templated("<s>[INST] <<SYS>>\\nBe brief.\\n<</SYS>>\\n\\nHi [/INST]")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    >>> parse_templated("<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜><think>\\n")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    >>> parse_templated("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n")
    [{'role': 'user', 'content': 'Hi'}]
    >>> parse_templated("See <|im_start|>user\\nHi<|im_end|>")  # text before the first turn: not a template
    """
    if not any(m in text for m in MARKERS):
        return None
    for marker, read in _FAMILIES:
        if marker in text:
            msgs = read(text)
            if msgs and any(m["role"] == "user" for m in msgs):
                return msgs
            return None
    return None
