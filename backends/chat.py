"""Chat prompts through a tokenizer's chat template, the way the policy was trained to read them.

A prompt is a plain string (given to the policy as it is) or a chat: ``{"messages": [...],
"thinking": bool | None}``. A chat is rendered with the tokenizer's template
(``add_generation_prompt=True``; the template's thinking switch, ``enable_thinking``, when
the task sets one); a tokenizer without a template reads the last user message as plain
text. Nothing here knows the studio: the worker jobs call it.
"""
from __future__ import annotations


class TemplateError(ValueError):
    """A chat template that fails to render the given messages; the message says which and why."""


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render(tokenizer, prompt: str | dict) -> str:
    """The text the policy continues for ``prompt`` (see the module docstring)."""
    if isinstance(prompt, str):
        return prompt
    messages = prompt["messages"]
    if not has_template(tokenizer):
        users = [m["content"] for m in messages if m.get("role") == "user"]
        return users[-1] if users else messages[-1]["content"]
    kwargs = {} if prompt.get("thinking") is None else {"enable_thinking": bool(prompt["thinking"])}
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception as exc:  # jinja2's errors, a template that raises on purpose (unsupported roles)
        roles = ", ".join(m.get("role", "?") for m in messages)
        raise TemplateError(f"the policy's chat template cannot render messages with roles [{roles}]: "
                            f"{type(exc).__name__}: {exc}") from None
    if not isinstance(text, str):  # a template that returns token ids or a dict
        raise TemplateError(f"the policy's chat template rendered {type(text).__name__}, not text")
    return text


def render_all(tokenizer, prompts: list[str | dict]) -> list[str]:
    return [render(tokenizer, p) for p in prompts]
