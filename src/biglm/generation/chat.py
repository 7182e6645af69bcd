"""Chat prompts: a list of messages rendered to the prompt text a BiGLM continues.

One place for the chat format, used by instruction tuning (which saves the template with the
model as the tokenizer's ``chat_template``), `biglm chat`, `biglm generate` and the server's
``/v1/chat/completions``. A model that carries its own template (``tokenizer.chat_template``, a
Jinja string as in transformers) is rendered with it through ``apply_chat_template``; a model
without one (a pre-trained run) uses `DEFAULT_CHAT_TEMPLATE`, a plain-text turn format that a
model trained on documents can continue.

The rendered prompt is the BiGLM prefix; the assistant's answer is the suffix written by
iterative unmasking, so the template ends where the answer starts (``add_generation_prompt``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ROLES = ("system", "user", "assistant")

# Jinja, as transformers' chat templates: no special tokens, so the prompt looks like text.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def check_messages(messages: Sequence[Mapping[str, object]]) -> list[dict[str, str]]:
    """``messages`` as plain dicts, or a ValueError naming the bad entry and the fix."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or len(messages) == 0:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} objects.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content', got {type(m).__name__}.")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role={role!r}: choose one of {', '.join(ROLES)}.")
        if isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            content = text_parts(content, where=f"messages[{i}].content")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts, got "
                             f"{type(content).__name__}.")
        out.append({"role": str(role), "content": content})
    if not any(m["role"] == "user" for m in out):
        raise ValueError("messages has no 'user' message: add the user's turn.")
    return out


def text_parts(parts: Sequence[object], *, where: str) -> str:
    """OpenAI's content parts (``[{"type": "text", "text": ...}, ...]``) as one text, joined by newlines as vLLM
    joins them; a part of another type (an image, audio) is refused: a BiGLM reads text only."""
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}] must be a text part {{'type': 'text', 'text': ...}} (got "
                             f"{kind if kind is not None else type(part).__name__!r}): this model reads text only.")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_template(tokenizer) -> str:
    """The model's own template, else `DEFAULT_CHAT_TEMPLATE`."""
    return getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE


def render_chat(tokenizer, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` under the model's chat template (the answer starts right after it)."""
    checked = check_messages(messages)
    return tokenizer.apply_chat_template(checked, chat_template=chat_template(tokenizer), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
