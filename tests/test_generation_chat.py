"""Chat prompts: the default template, a model's own template, and bad messages."""

import pytest

from biglm.data.tokenizer import train_tokenizer
from biglm.generation.chat import DEFAULT_CHAT_TEMPLATE, check_messages, render_chat


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(texts=["hello there, how are you today?"] * 20, vocab_size=280)


def test_default_template_renders_turns_and_ends_where_the_answer_starts(tok):
    tok.chat_template = None
    text = render_chat(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                             {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Name?"}])
    assert text == "Be brief.\n\nUser: Hi?\nAssistant: Hello.\nUser: Name?\nAssistant:"


def test_a_models_own_template_wins(tok):
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<answer>{% endif %}"
    try:
        assert render_chat(tok, [{"role": "user", "content": "x"}]) == "<user>x<answer>"
    finally:
        tok.chat_template = None
    assert "User:" in DEFAULT_CHAT_TEMPLATE


@pytest.mark.parametrize("messages, needle", [
    ([], "non-empty"), ("hi", "non-empty"), ([{"role": "bot", "content": "x"}], "role='bot'"),
    ([{"role": "user", "content": 3}], "content must be a string"), ([{"role": "system", "content": "x"}], "no 'user'"),
])
def test_bad_messages_are_named(messages, needle):
    with pytest.raises(ValueError, match=needle):
        check_messages(messages)
