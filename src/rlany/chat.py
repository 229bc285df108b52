"""Chat rendering with the tokenizer's own chat template: the single place prompts become
token ids, shared by the engines and by training.

A message's content is a string, or, when an observation carries images (GUI envs), a
list of OpenAI-style parts: `{"type": "image_url", "image_url": {"url": "file:///abs.png"}}`
and `{"type": "text", "text": ...}`. `user_content` builds it; `text_of` and `images_of`
read it back."""

from __future__ import annotations

from typing import Any

from rlany.errors import RlanyError


def user_content(text: str, images: list[str] | tuple[str, ...] = ()) -> str | list[dict]:
    """A plain string, or image parts (absolute file:// URLs) followed by the text."""
    if not images:
        return text
    from pathlib import Path

    return [*({"type": "image_url", "image_url": {"url": Path(p).resolve().as_uri()}}
              for p in images), {"type": "text", "text": text}]


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or []
                     if isinstance(part, dict) and part.get("type") == "text")


def images_of(content: Any) -> list[str]:
    """The image URLs of a message's content (none for a string)."""
    if isinstance(content, str):
        return []
    return [part["image_url"]["url"] for part in content or []
            if isinstance(part, dict) and part.get("type") == "image_url"]


def has_images(messages: list[dict]) -> bool:
    return any(images_of(m.get("content")) for m in messages)


def render_text(tokenizer: Any, messages: list[dict]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise RlanyError("the model's tokenizer has no chat template",
                         hint="use an instruct/chat model, or add chat_template to "
                         "tokenizer_config.json")
    if has_images(messages):
        raise RlanyError("this prompt has images but this path renders text only",
                         hint="use --engine vllm or --engine openai with a multimodal model; "
                         "training on image observations is not supported yet")
    # text parts become the plain string every chat template reads
    messages = [{**m, "content": text_of(m["content"])} if isinstance(m.get("content"), list)
                else m for m in messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Prompt token ids, ending with the generation prompt (e.g. `<|im_start|>assistant\\n`)."""
    return tokenizer(render_text(tokenizer, messages), add_special_tokens=False)["input_ids"]
