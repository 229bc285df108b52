"""Chat rendering with the tokenizer's own chat template: the single place prompts become
token ids, shared by the engines and by training."""

from __future__ import annotations

from typing import Any

from rlany.errors import RlanyError


def render_text(tokenizer: Any, messages: list[dict]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise RlanyError("the model's tokenizer has no chat template",
                         hint="use an instruct/chat model, or add chat_template to "
                         "tokenizer_config.json")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Prompt token ids, ending with the generation prompt (e.g. `<|im_start|>assistant\\n`)."""
    return tokenizer(render_text(tokenizer, messages), add_special_tokens=False)["input_ids"]
