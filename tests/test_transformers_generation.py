"""Generation the transformers way: ``pipeline("text-generation", model=EXPORT)`` and ``model.generate`` write what
`biglm generate` writes (greedy, float32), on a tiny export and on the real SmolLM2 converted."""

from __future__ import annotations

import pytest
import torch
from conftest import biglm_generate_answer
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

import biglm  # noqa: F401 - registers the Auto classes and the pipeline
from biglm.checkpoint import load_model
from biglm.generation.chat import chat_template
from biglm.generation.config import model_decoding
from biglm.generation.decoding import generate_ids, left_pad
from biglm.integrations.transformers_generation import TextGenerationPipeline

PROMPTS = ["The king said to the", "ROMEO:\nI will"]


def _biglm_ids(path, prompts: list[str], **options) -> list[list[int]]:
    """The answer ids `biglm generate` decodes: its loading (prepacked linears) and the model's decoding settings."""
    model, tok = load_model(path, pack=True)
    ids, mask = left_pad([tok(p, add_special_tokens=False)["input_ids"] for p in prompts], pad_id=model.config.pad_token_id)
    out = generate_ids(model, ids, mask, config=model_decoding(model.config, options),
                       suppress_ids=list(range(len(tok), model.config.vocab_size)))
    return out.token_lists()


@pytest.mark.parametrize("flags", [{}, {"max_new_tokens": 20, "steps": 5}, {"max_new_tokens": 9, "strategy": "confidence"},
                                   {"max_new_tokens": 16, "temperature": 1.0, "seed": 3}])  # sampled: varied tokens
def test_pipeline_writes_what_biglm_generate_writes(checkpoint, capsys, flags):
    gen = pipeline("text-generation", model=str(checkpoint))
    assert type(gen) is TextGenerationPipeline and gen.model.dtype == torch.float32
    sampled = {"do_sample": True} if "temperature" in flags else {}  # transformers samples with do_sample only
    for prompt in PROMPTS:
        expected = biglm_generate_answer(checkpoint, prompt, capsys, **flags)
        assert gen(prompt, return_full_text=False, **flags, **sampled) == [{"generated_text": expected}]
        assert gen(prompt, **flags, **sampled) == [{"generated_text": prompt + expected}]
    assert gen(PROMPTS, return_full_text=False, **flags, **sampled) == [
        [{"generated_text": biglm_generate_answer(checkpoint, p, capsys, **flags)}] for p in PROMPTS]


def test_model_generate_returns_the_prompt_and_biglm_generates_answer_ids(checkpoint, capsys):
    model = AutoModelForMaskedLM.from_pretrained(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    expected = _biglm_ids(checkpoint, PROMPTS, max_new_tokens=24)
    for prompt, answer in zip(PROMPTS, expected):
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=24)
        assert torch.equal(out[:, :ids.shape[1]], ids)
        tail = out[0, ids.shape[1]:].tolist()
        assert tail[:len(answer)] == answer and set(tail[len(answer):]) <= {eos, pad}
        assert torch.equal(model.diffusion_generate(input_ids=ids, max_new_tokens=24), out)
        text = tok.decode(tail, skip_special_tokens=True)
        assert text == biglm_generate_answer(checkpoint, prompt, capsys, max_new_tokens=24)
    # a batch padded on the right (transformers' tokenizer default here) answers as `biglm generate`'s batch
    tok.padding_side = "right"
    batch = tok(PROMPTS, add_special_tokens=False, padding=True, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=24)
    width = batch.input_ids.shape[1]
    for row, answer in zip(out, expected):
        tail = row[width:].tolist()
        assert tail[:len(answer)] == answer and set(tail[len(answer):]) <= {eos, pad}
    assert out.shape[1] == width + max(len(a) + (len(a) < 24) for a in expected)


def test_decoding_options_arrive_and_bad_ones_are_refused(checkpoint):
    from transformers import GenerationConfig

    model = AutoModelForMaskedLM.from_pretrained(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    ids = tok(PROMPTS[0], add_special_tokens=False, return_tensors="pt").input_ids
    greedy = model.generate(ids, max_new_tokens=12, steps=4)
    assert torch.equal(model.generate(ids, generation_config=GenerationConfig(max_new_tokens=12, do_sample=False),
                                      steps=4), greedy)
    assert torch.equal(model.generate(ids, max_new_tokens=12, steps=4, do_sample=False, temperature=0.7), greedy)
    sampled = [model.generate(ids, max_new_tokens=12, steps=4, do_sample=True, temperature=1.5, seed=s)
               for s in (1, 1, 2)]
    assert torch.equal(sampled[0], sampled[1]) and not torch.equal(sampled[0], sampled[2])
    with pytest.raises(ValueError, match="max_length=30: no counterpart.*give max_new_tokens"):
        model.generate(ids, max_length=30)
    with pytest.raises(ValueError, match="stop strings cut the answer's text"):
        model.generate(ids, stop=["\n"])
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(ids, generation_config=GenerationConfig(num_beams=4))
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    with pytest.raises(ValueError, match="unknown generation option.*bogus"):
        gen(PROMPTS[0], bogus=1)
    sampling = {"max_new_tokens": 30, "do_sample": True, "temperature": 1.0, "seed": 5, "return_full_text": False}
    text = gen(PROMPTS[0], **sampling)[0]["generated_text"]
    stop = next(text[i:i + 2] for i in range(len(text) // 3, len(text)) if text[i:i + 2].strip())
    cut = gen(PROMPTS[0], stop_sequence=stop, **sampling)[0]["generated_text"]
    assert cut == text[:text.find(stop)] and len(cut) < len(text)


def test_other_models_keep_transformers_own_pipeline(tmp_path, checkpoint):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.pipelines.text_generation import TextGenerationPipeline as Transformers

    tok = AutoTokenizer.from_pretrained(checkpoint)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok))).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gen = pipeline("text-generation", model=str(tmp_path))
    assert type(gen) is Transformers
    assert gen(PROMPTS[0], max_new_tokens=3, do_sample=False)[0]["generated_text"].startswith(PROMPTS[0])


def test_real_smol_pipeline_and_generate_write_what_biglm_generate_writes(real_smol, capsys):
    prompt = "The capital of France is"
    expected = biglm_generate_answer(real_smol, prompt, capsys, max_new_tokens=16)
    gen = pipeline("text-generation", model=str(real_smol))
    assert gen.model.dtype == torch.float32  # as converted, and as `biglm generate` loads it
    assert gen(prompt, max_new_tokens=16, return_full_text=False) == [{"generated_text": expected}]
    ids = gen.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    out = gen.model.generate(ids, max_new_tokens=16, tokenizer=gen.tokenizer)
    assert gen.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True) == expected
    assert expected.strip()  # a real answer, not an empty one


def test_a_seq2seq_fine_tune_loads_with_its_length_head_and_a_chat_gets_the_template(checkpoint, tmp_path, capsys):
    from biglm.generation import generate
    from biglm.generation.chat import render_chat
    from biglm.model.seq2seq import BiGLMForConditionalGeneration

    torch.manual_seed(1)
    mlm, tok = load_model(checkpoint)
    BiGLMForConditionalGeneration.from_masked_lm(mlm, max_target_length=12).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gen = pipeline("text-generation", model=str(tmp_path))
    assert type(gen.model) is BiGLMForConditionalGeneration  # its length head picks the answer's length
    assert gen(PROMPTS[0], return_full_text=False) == [{"generated_text": biglm_generate_answer(tmp_path, PROMPTS[0],
                                                                                                capsys)}]
    messages = [{"role": "user", "content": "Who is there?"}]
    answer = generate(gen.model, gen.tokenizer, [render_chat(gen.tokenizer, messages)])[0]
    assert gen(messages) == [{"generated_text": [*messages, {"role": "assistant", "content": answer}]}]


# transformers' idioms (issue 50): batches, do_sample / temperature / set_seed, keywords, pipeline options, streamers


def _model_and_ids(checkpoint, prompt: str = PROMPTS[0]):
    model = AutoModelForMaskedLM.from_pretrained(checkpoint)
    tok = AutoTokenizer.from_pretrained(checkpoint)
    return model, tok, tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids


def test_a_batched_pipeline_answers_prompts_of_any_lengths_and_chats_as_it_answers_each_alone(checkpoint):
    gen = pipeline("text-generation", model=str(checkpoint))
    opts = {"max_new_tokens": 10, "steps": 4}
    prompts = ["a b c", "d e f", *PROMPTS]  # 3, 3, 5 and 6 tokens
    alone = [gen(p, **opts) for p in prompts]
    assert gen(prompts, batch_size=2, **opts) == alone
    assert gen(prompts, batch_size=3, return_full_text=False, **opts) == [
        [{"generated_text": a[0]["generated_text"][len(p):]}] for p, a in zip(prompts, alone)]
    chats = [[{"role": "user", "content": "Who is there?"}],
             [{"role": "system", "content": "Answer in verse."}, {"role": "user", "content": "What light breaks?"}]]
    assert gen(chats, batch_size=2, **opts) == [gen(c, **opts) for c in chats]


def test_do_sample_draws_from_torchs_global_stream_so_set_seed_fixes_and_changes_the_text(checkpoint):
    from transformers import set_seed

    gen = pipeline("text-generation", model=str(checkpoint))
    opts = {"max_new_tokens": 12, "do_sample": True, "return_full_text": False}

    def text(seed: int | None = None) -> str:
        if seed is not None:
            set_seed(seed)
        return gen(PROMPTS[0], **opts)[0]["generated_text"]

    assert text(1) == text(1) != text(2)
    set_seed(1)
    assert text() != text()  # each call draws anew, as an autoregressive model's sampling does
    ids = gen.tokenizer(PROMPTS[0], add_special_tokens=False, return_tensors="pt").input_ids
    drawn = []
    for seed in (3, 3, None):
        if seed is not None:
            set_seed(seed)
        drawn.append(gen.model.generate(ids, max_new_tokens=12, do_sample=True))
    assert torch.equal(drawn[0], drawn[1]) and not torch.equal(drawn[1], drawn[2])
    # biglm's own seed= keeps a sampled call reproducible whatever the global stream holds
    fixed = []
    for seed in (1, 2):
        set_seed(seed)
        fixed.append(gen.model.generate(ids, max_new_tokens=12, do_sample=True, seed=4))
    assert torch.equal(*fixed)


def test_temperature_without_do_sample_is_greedy_and_do_sample_at_temperature_zero_is_refused(checkpoint):
    model, tok, ids = _model_and_ids(checkpoint)
    greedy = model.generate(ids, max_new_tokens=12)
    assert torch.equal(model.generate(ids, max_new_tokens=12, temperature=0.8), greedy)  # transformers ignores it
    assert torch.equal(model.generate(ids, max_new_tokens=12, temperature=0.8, top_k=5, top_p=0.5), greedy)
    assert not torch.equal(model.generate(ids, max_new_tokens=12, do_sample=True, temperature=0.8, seed=0), greedy)
    refused = r"`temperature` \(=0.0\) has to be a strictly positive float.*set `do_sample=False`"
    with pytest.raises(ValueError, match=refused):
        model.generate(ids, max_new_tokens=12, do_sample=True, temperature=0.0)
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    assert gen(PROMPTS[0], max_new_tokens=12, temperature=0.8) == gen(PROMPTS[0], max_new_tokens=12)
    with pytest.raises(ValueError, match=refused):
        gen(PROMPTS[0], do_sample=True, temperature=0.0)


def test_pad_token_id_and_eos_token_id_keywords_pad_and_end_the_answers(checkpoint):
    model, tok, _ = _model_and_ids(checkpoint)
    tok.padding_side = "left"
    batch = tok(PROMPTS, add_special_tokens=False, padding=True, return_tensors="pt")
    P, eos = batch.input_ids.shape[1], model.config.eos_token_id
    opts = {"max_new_tokens": 12, "do_sample": True, "seed": 2}  # varied tokens
    first, second = (row[P:].tolist() for row in model.generate(**batch, **opts))
    # a token first written at slot k >= 2 of the first answer that the second never writes ends the first there
    k, end = next((k, t) for k, t in enumerate(first) if k >= 2 and t not in first[:k] and t not in second)
    out = model.generate(**batch, **opts, eos_token_id=[eos, end], pad_token_id=eos)  # the GPT-2 idiom
    assert out[0, P:].tolist() == first[:k + 1] + [eos] * (len(second) - k - 1)
    assert out[1, P:].tolist() == second
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    assert gen(PROMPTS[0], max_new_tokens=12, pad_token_id=tok.pad_token_id, eos_token_id=eos) == gen(
        PROMPTS[0], max_new_tokens=12)


def test_pipeline_options_are_read_as_transformers_pipeline_reads_them(checkpoint):
    from transformers import GenerationConfig

    gen = pipeline("text-generation", model=str(checkpoint))
    opts = {"max_new_tokens": 10}
    full = gen(PROMPTS[0], **opts)
    answer = gen(PROMPTS[0], return_full_text=False, **opts)[0]["generated_text"]
    assert full == [{"generated_text": PROMPTS[0] + answer}]
    assert gen(PROMPTS[0], return_text=True, **opts) == full
    assert gen(PROMPTS[0], clean_up_tokenization_spaces=False, **opts) == full
    assert gen(PROMPTS[0], generate_kwargs=opts) == full
    assert gen(PROMPTS[0], generation_config=GenerationConfig(**opts)) == full
    assert pipeline("text-generation", model=str(checkpoint), **opts)(PROMPTS[0]) == full  # set at construction
    assert pipeline("text-generation", model=str(checkpoint), generation_config=GenerationConfig(**opts))(
        PROMPTS[0]) == full
    opts = {"max_new_tokens": 10, "do_sample": True, "seed": 7}  # sampled: an answer that depends on its prompt
    # prefix: the answer continues prefix + prompt; the text returned holds the prompt, not the prefix
    after_prefix = gen("ROMEO:\n" + PROMPTS[0], return_full_text=False, **opts)[0]["generated_text"]
    assert gen(PROMPTS[0], prefix="ROMEO:\n", **opts) == [{"generated_text": PROMPTS[0] + after_prefix}]
    # a chat ending in the assistant's message continues that message (continue_final_message, by default then)
    chat = [{"role": "user", "content": "Who is there?"}, {"role": "assistant", "content": "It is"}]
    text = gen.tokenizer.apply_chat_template(chat, chat_template=chat_template(gen.tokenizer), tokenize=False,
                                             continue_final_message=True)
    go_on = gen(text, return_full_text=False, **opts)[0]["generated_text"]
    assert gen(chat, **opts) == [{"generated_text": [chat[0], {"role": "assistant", "content": "It is" + go_on}]}]
    assert gen(chat, continue_final_message=True, return_full_text=False, **opts) == [{"generated_text": go_on}]
    new_turn = gen(chat, continue_final_message=False, **opts)[0]["generated_text"]
    assert new_turn[:2] == chat and new_turn[2]["role"] == "assistant"
    with pytest.raises(ValueError, match="mutually exclusive"):
        gen(PROMPTS[0], return_text=True, return_tensors=True)
    with pytest.raises(ValueError, match="truncation: a BiGLM's prompt is encoded as `biglm generate`"):
        gen(PROMPTS[0], truncation=True)


class _Recorder:
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.puts: list[list] = []
        self.ends = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.tolist())

    def end(self) -> None:
        self.ends += 1


def test_a_streamer_gets_the_prompt_then_the_answer_as_it_becomes_final_then_end(checkpoint, capsys):
    from transformers import TextIteratorStreamer, TextStreamer

    model, tok, ids = _model_and_ids(checkpoint)
    P = ids.shape[1]
    rec = _Recorder()
    # one token a call, left to right: the answer streams a token at a time
    out = model.generate(ids, max_new_tokens=8, strategy="confidence", block_length=1, steps=8, streamer=rec)
    answer = out[0, P:].tolist()
    assert rec.puts[0] == ids.tolist() and rec.ends == 1
    assert sum(rec.puts[1:], []) == answer and len(rec.puts) == 1 + len(answer)
    # Mask-Predict re-masks until its last call: the answer comes whole, at the end
    rec = _Recorder()
    out = model.generate(ids, max_new_tokens=8, streamer=rec)
    assert rec.puts == [ids.tolist(), out[0, P:].tolist()] and rec.ends == 1
    capsys.readouterr()
    out = model.generate(ids, max_new_tokens=8, streamer=TextStreamer(tok))
    assert capsys.readouterr().out == tok.decode(out[0]) + "\n"
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    out = model.generate(ids, max_new_tokens=8, strategy="confidence", block_length=2, steps=4, streamer=streamer)
    assert "".join(streamer) == tok.decode(out[0, P:])
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    text = gen(PROMPTS[0], max_new_tokens=8, streamer=streamer, return_full_text=False)[0]["generated_text"]
    assert "".join(streamer) == text
    with pytest.raises(ValueError, match="streamer: one prompt at a time"):
        model.generate(torch.cat([ids, ids]), max_new_tokens=8, streamer=_Recorder())


def test_the_model_can_generate_and_its_generation_config_is_read(checkpoint):
    from transformers import GenerationConfig

    model, _, ids = _model_and_ids(checkpoint)
    assert model.can_generate() and isinstance(model.generation_config, GenerationConfig)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (
        model.config.eos_token_id, model.config.pad_token_id)
    default, five = model.generate(ids), model.generate(ids, max_new_tokens=5)
    assert torch.equal(model.generate(ids, generation_config=model.generation_config), default)
    model.generation_config.max_new_tokens = 5
    assert torch.equal(model.generate(ids), five)
