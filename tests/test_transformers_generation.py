"""Generation the transformers way: ``pipeline("text-generation", model=EXPORT)`` and ``model.generate`` write what
`biglm generate` writes (greedy, float32), on a tiny export and on the real SmolLM2 converted."""

from __future__ import annotations

import pytest
import torch
from conftest import biglm_generate_answer
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

import biglm  # noqa: F401 - registers the Auto classes and the pipeline
from biglm.checkpoint import load_model
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
    for prompt in PROMPTS:
        expected = biglm_generate_answer(checkpoint, prompt, capsys, **flags)
        assert gen(prompt, return_full_text=False, **flags) == [{"generated_text": expected}]
        assert gen(prompt, **flags) == [{"generated_text": prompt + expected}]
    assert gen(PROMPTS, return_full_text=False, **flags) == [
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
    sampled = [model.generate(ids, max_new_tokens=12, steps=4, temperature=1.5, seed=s) for s in (1, 1, 2)]
    assert torch.equal(sampled[0], sampled[1]) and not torch.equal(sampled[0], sampled[2])
    with pytest.raises(ValueError, match="unknown generation option.*max_length"):
        model.generate(ids, max_length=30)
    with pytest.raises(ValueError, match="stop strings cut the answer's text"):
        model.generate(ids, stop=["\n"])
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(ids, generation_config=GenerationConfig(num_beams=4))
    gen = pipeline("text-generation", model=model, tokenizer=tok)
    with pytest.raises(ValueError, match="unknown generation option.*bogus"):
        gen(PROMPTS[0], bogus=1)
    sampling = {"max_new_tokens": 30, "temperature": 1.0, "seed": 5, "return_full_text": False}
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
