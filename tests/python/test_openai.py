"""The OpenAI API of `sluice serve`, driven with the official `openai` client."""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import openai
import pytest

from conftest import MODEL, Server, assert_error_shape, binary, raw, series

MESSAGES = [{"role": "user", "content": "Name three rivers in Europe."}]


def test_models_are_listed(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_completion_has_openai_shape(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_text_parts_are_accepted(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three rivers"},
                                          {"type": "text", "text": " in Europe."}]}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=12, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens <= 8
    # Several prompts: one choice each, numbered in order.
    r = client.completions.create(model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=4,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    single = client.completions.create(model=MODEL, prompt="Red, green,", max_tokens=4,
                                       temperature=0)
    assert r.choices[1].text == single.choices[0].text
    # Token ids as the prompt.
    ids = raw(client.base_url.__str__().removesuffix("/v1/"), "/tokenize",
              {"prompt": "The capital of France is"})[2]["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    text = client.completions.create(model=MODEL, prompt="The capital of France is",
                                     max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == text.choices[0].text


def test_stream_equals_non_stream_at_temperature_zero(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40,
                                          temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])

    prompt = "Once upon a time"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stream=True) if c.choices)
    assert streamed == full.choices[0].text


def test_stop_strings_cut_the_text(client):
    full = client.completions.create(model=MODEL, prompt="Count: one, two, three, four,",
                                     max_tokens=30, temperature=0).choices[0].text
    words = [w for w in full.split() if len(w) > 3]
    assert words, full
    stop = words[len(words) // 2]
    r = client.completions.create(model=MODEL, prompt="Count: one, two, three, four,",
                                  max_tokens=30, temperature=0, stop=[stop, "never-seen"])
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    s = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Count: one, two, three, four,", max_tokens=30, temperature=0,
        stop=stop, stream=True) if c.choices)
    assert s == r.choices[0].text


def test_vllm_rendering_and_stop_extensions(client, server):
    """vLLM's `include_stop_str_in_output` keeps the stop string; `add_generation_prompt:
    false` leaves the assistant turn unopened (the prompt is shorter by exactly what /tokenize
    says); `chat_template_kwargs` reach the template (the default one reads none)."""
    prompt = "Count: one, two, three, four,"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30,
                                     temperature=0).choices[0].text
    stop = [w for w in full.split() if len(w) > 3][0]
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0,
                                  stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == full[: full.index(stop) + len(stop)]
    assert r.choices[0].finish_reason == "stop"
    counts = {}
    for gen in (True, False):
        _, _, t = raw(server.url, "/tokenize", {"model": MODEL, "messages": MESSAGES,
                                                "add_generation_prompt": gen})
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0,
            extra_body={"add_generation_prompt": gen,
                        "chat_template_kwargs": {"enable_thinking": False}})
        assert r.usage.prompt_tokens == t["count"]
        counts[gen] = t["count"]
    assert counts[True] > counts[False]


def test_echo_with_logprobs_scores_the_prompt(client, server):
    """Completions' `echo` with `logprobs`, as lm-evaluation-harness scores a continuation:
    text and log-probabilities begin with the prompt's tokens, the first without one; each
    other prompt token's is its log-probability after the tokens before it (what forcing it
    there with a +100 bias reports); `max_tokens: 0` answers the prompt alone; streamed, the
    same text and tokens; several prompts and choices each begin with their own prompt."""
    text = "The capital of France is Paris, and the capital of Italy is"
    ids = raw(server.url, "/tokenize", {"prompt": text})[2]["tokens"]
    args = dict(model=MODEL, max_tokens=2, temperature=0, echo=True, logprobs=1)
    r = client.completions.create(prompt=ids, **args)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 2 and r.choices[0].text.startswith(text)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[len(ids)] == len(text)
    for j in (1, len(ids) // 2, len(ids) - 1):
        forced = client.completions.create(
            model=MODEL, prompt=ids[:j], max_tokens=1, temperature=0, logprobs=0,
            logit_bias={str(ids[j]): 100}).choices[0].logprobs
        assert forced.tokens[0] == lp.tokens[j]
        assert abs(forced.token_logprobs[0] - lp.token_logprobs[j]) < 1e-3, j
        assert max(lp.top_logprobs[j].values()) >= lp.token_logprobs[j] - 1e-6
    only = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True,
                                     logprobs=1)
    c = only.choices[0]
    assert (c.text, c.finish_reason, only.usage.completion_tokens) == (text, "length", 0)
    assert c.logprobs.tokens == lp.tokens[:len(ids)]
    assert c.logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:len(ids)], abs=1e-5)
    chunks = [ch for ch in client.completions.create(prompt=text, stream=True, **args)]
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.tokens]
    assert streamed == lp.tokens
    many = client.completions.create(model=MODEL, prompt=["Hello there", "One, two,"], n=2,
                                     max_tokens=3, temperature=0.7, seed=1, echo=True)
    for ch in many.choices:
        assert ch.text.startswith(["Hello there", "One, two,"][ch.index // 2]), ch.text
    status, _, b = raw(server.url, "/v1/completions", {"model": MODEL, "prompt": text,
                                                        "max_tokens": 0})
    assert status == 400 and b["error"]["param"] == "max_tokens", b
    # Echoed alone, a prompt may fill the context but for the one token the engine runs.
    fits = client.completions.create(model=MODEL, prompt=[ids[-1]] * 2047, max_tokens=0,
                                     echo=True)
    assert fits.usage.prompt_tokens == 2047 and fits.usage.completion_tokens == 0
    status, _, b = raw(server.url, "/v1/completions", {"model": MODEL, "prompt": [ids[-1]] * 2048,
                                                        "max_tokens": 0, "echo": True})
    err = b["error"]
    assert status == 400 and err["code"] == "context_length_exceeded", b
    assert "2047" in err["message"] and "completion tokens" not in err["message"], err


def test_vllm_prompt_logprobs_rank_every_prompt_token(client, server):
    """vLLM's `prompt_logprobs`: per choice on completions, beside the choices on chat;
    `null` for the first prompt token, then per token a map from token id to log-probability,
    rank and text holding the token itself (its log-probability the one echo reports) and its
    position's k most likely (ranks 1..k); refused with `stream`, as vLLM refuses it."""
    text = "The capital of France is Paris"
    ids = raw(server.url, "/tokenize", {"prompt": text})[2]["tokens"]
    status, _, b = raw(server.url, "/v1/completions", {
        "model": MODEL, "prompt": text, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2,
        "echo": True, "logprobs": 1})
    assert status == 200, b
    ranked, echoed = b["choices"][0]["prompt_logprobs"], b["choices"][0]["logprobs"]
    assert len(ranked) == len(ids) and ranked[0] is None
    for j in range(1, len(ids)):
        entry, own = ranked[j], ranked[j][str(ids[j])]
        assert own["logprob"] == pytest.approx(echoed["token_logprobs"][j], abs=1e-6)
        assert own["decoded_token"] == echoed["tokens"][j]
        others = sorted(v["rank"] for k, v in entry.items() if k != str(ids[j]))
        assert others == ([1, 2] if own["rank"] > 2 else [r for r in (1, 2) if r != own["rank"]])
        assert all(v["logprob"] <= 0 for v in entry.values())
    chat_ids = raw(server.url, "/tokenize", {"messages": MESSAGES})[2]["tokens"]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                       extra_body={"prompt_logprobs": 0})
    ranked = r.model_extra["prompt_logprobs"]
    assert len(ranked) == len(chat_ids) and ranked[0] is None
    assert all(list(e) == [str(t)] for e, t in zip(ranked[1:], chat_ids[1:]))
    status, _, b = raw(server.url, "/v1/chat/completions", {
        "model": MODEL, "messages": MESSAGES, "stream": True, "prompt_logprobs": 1})
    assert status == 400 and b["error"]["param"] == "prompt_logprobs", b


def test_vllm_truncate_prompt_tokens_and_token_ids(client, server):
    """vLLM's `truncate_prompt_tokens: k` keeps the prompt's last k tokens (the reply is what
    those k tokens alone give; -1 leaves a prompt within the context whole; 0, -2 and more
    than the context are 400s naming it). `return_tokens_as_token_ids` names the
    log-probabilities' tokens `token_id:<id>` (the ids of the text, the same figures and
    offsets; chat's `bytes` are the name's)."""
    text = "One, two, three, four, five, six, seven, eight"
    ids = raw(server.url, "/tokenize", {"prompt": text})[2]["tokens"]
    base = dict(model=MODEL, max_tokens=6, temperature=0)
    cut = client.completions.create(prompt=text, extra_body={"truncate_prompt_tokens": 5}, **base)
    assert cut.usage.prompt_tokens == 5
    alone = client.completions.create(prompt=ids[-5:], **base)
    assert cut.choices[0].text == alone.choices[0].text
    whole = client.completions.create(prompt=text, extra_body={"truncate_prompt_tokens": -1},
                                      **base)
    assert whole.usage.prompt_tokens == len(ids)
    chat = client.chat.completions.create(messages=MESSAGES,
                                          extra_body={"truncate_prompt_tokens": 4}, **base)
    assert chat.usage.prompt_tokens == 4
    for bad in (0, -2, 5000):
        status, _, b = raw(server.url, "/v1/completions",
                           {"model": MODEL, "prompt": text, "truncate_prompt_tokens": bad})
        assert status == 400 and b["error"]["param"] == "truncate_prompt_tokens", b
    by_text = client.completions.create(prompt=text, logprobs=2, **base).choices[0]
    by_id = client.completions.create(prompt=text, logprobs=2, **base,
                                      extra_body={"return_tokens_as_token_ids": True}).choices[0]
    assert by_id.text == by_text.text
    named = [int(t.removeprefix("token_id:")) for t in by_id.logprobs.tokens]
    assert all(t.startswith("token_id:") for t in by_id.logprobs.tokens)
    assert raw(server.url, "/detokenize", {"tokens": named})[2]["prompt"] == by_text.text
    assert by_id.logprobs.token_logprobs == by_text.logprobs.token_logprobs
    assert by_id.logprobs.text_offset == by_text.logprobs.text_offset
    assert all(all(k.startswith("token_id:") for k in top) for top in by_id.logprobs.top_logprobs)
    c = client.chat.completions.create(messages=MESSAGES, logprobs=True, top_logprobs=2, **base,
                                       extra_body={"return_tokens_as_token_ids": True})
    for lp in c.choices[0].logprobs.content:
        assert lp.token.startswith("token_id:") and lp.bytes == list(lp.token.encode())
        assert all(t.token.startswith("token_id:") for t in lp.top_logprobs)


def test_vllm_bad_words_are_never_written(client, server):
    """vLLM's `bad_words`: a word of the free greedy answer, banned, appears in the new
    answer's tokens neither as it starts a text nor after a space (token ids read back with
    `return_tokens_as_token_ids`); an empty word is a 400 naming the field."""
    args = dict(model=MODEL, prompt="The capital of France is", max_tokens=16, temperature=0,
                logprobs=0)
    free = client.completions.create(**args).choices[0].text
    word = max(free.split(), key=len).strip(".,;:!?")
    assert len(word) > 2, free
    r = client.completions.create(**args, extra_body={"bad_words": [word],
                                                      "return_tokens_as_token_ids": True})
    out = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
    assert r.choices[0].text != free
    for variant in (word, " " + word):
        ids = raw(server.url, "/tokenize", {"prompt": variant})[2]["tokens"]
        assert all(out[i:i + len(ids)] != ids for i in range(len(out))), (variant, out)
    status, _, b = raw(server.url, "/v1/completions", {"model": MODEL, "prompt": "Hi",
                                                        "bad_words": ["  "]})
    assert status == 400 and b["error"]["param"] == "bad_words", b


def test_vllm_allowed_token_ids_bound_the_answer(client, server):
    """vLLM's `allowed_token_ids`, as a multiple-choice prompt uses it: every token of the
    answer is listed (read back as ids), on both endpoints; an empty list or an id outside
    the vocabulary is a 400 naming the field."""
    choices = [raw(server.url, "/tokenize", {"prompt": t})[2]["tokens"][0]
               for t in (" A", " B", " C", " D")]
    ask = "Question: which letter comes first in the alphabet? A, B, C or D?\nAnswer:"
    r = client.completions.create(
        model=MODEL, prompt=ask, max_tokens=3, temperature=0, logprobs=0,
        extra_body={"allowed_token_ids": choices, "return_tokens_as_token_ids": True})
    out = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
    assert len(out) == 3 and set(out) <= set(choices), out
    c = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], max_tokens=2, temperature=0.9,
        seed=3, extra_body={"allowed_token_ids": choices})
    assert c.choices[0].message.content.strip(" ABCD") == "", c.choices[0].message.content
    for bad in ([], [10**6]):
        status, _, b = raw(server.url, "/v1/completions",
                           {"model": MODEL, "prompt": ask, "allowed_token_ids": bad})
        assert status == 400 and b["error"]["param"] == "allowed_token_ids", b


def test_vllm_beam_search_answers_the_best_beams(client, server):
    """vLLM's `use_beam_search` with n beams: n distinct answers, best first by vLLM's score
    (the log-probability of prompt and answer over their length), each answer's
    log-probability what scoring it with echo reports (and the end-of-sequence token's, for
    an answer that stopped); the best scores at least what the greedy answer does. On chat
    too; refused beside streaming, log-probabilities, a response format or more than 10 beams,
    and `length_penalty` without it."""
    prompt = "The capital of France is"
    tokenize = lambda text: raw(server.url, "/tokenize", {"prompt": text})[2]["tokens"]
    ids, eos = tokenize(prompt), 2

    def score(text, stopped):
        out = tokenize(text)
        scored = client.completions.create(model=MODEL, prompt=ids + out, max_tokens=0,
                                           echo=True, logprobs=0).choices[0].logprobs
        total = sum(scored.token_logprobs[len(ids):])
        if stopped:
            total += client.completions.create(
                model=MODEL, prompt=ids + out, max_tokens=1, logprobs=0, temperature=0,
                logit_bias={str(eos): 100}, extra_body={"ignore_eos": True},
            ).choices[0].logprobs.token_logprobs[0]
        return total / (len(ids) + len(out))

    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, n=3,
                                  extra_body={"use_beam_search": True})
    answers = [(c.text, c.finish_reason == "stop") for c in r.choices]
    assert len({t for t, _ in answers}) == 3, answers
    scores = [score(t, s) for t, s in answers]
    assert all(a >= b - 1e-2 for a, b in zip(scores, scores[1:])), (answers, scores)
    greedy = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8,
                                       temperature=0).choices[0]
    assert scores[0] >= score(greedy.text, greedy.finish_reason == "stop") - 1e-2
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, n=2,
                                          extra_body={"use_beam_search": True,
                                                      "length_penalty": 0.5})
    assert len(chat.choices) == 2 and all(c.message.content for c in chat.choices)
    base = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "use_beam_search": True}
    for extra, param in [({"stream": True}, "use_beam_search"), ({"logprobs": 1}, "use_beam_search"),
                         ({"response_format": {"type": "json_object"}}, "use_beam_search"),
                         ({"n": 11}, "n"), ({"use_beam_search": False, "length_penalty": 2},
                                            "length_penalty")]:
        status, _, b = raw(server.url, "/v1/completions", {**base, **extra})
        assert status == 400 and b["error"]["param"] == param, (extra, b)


BEGUN = [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Sure! The capital of France is"}]


def test_continue_final_message_goes_on_from_the_reply_begun(client, server):
    """vLLM's `continue_final_message`: the prompt stops inside the final message, right after
    its text, and the reply holds only the continuation. Greedy, that is exactly what the
    same prompt ids give through /v1/completions (ids /tokenize reports for the same fields,
    whose text ends with the begun reply; the closed chat goes on past it); streamed, the
    same text; `add_generation_prompt` left out is not asking for a new turn."""
    _, _, t = raw(server.url, "/tokenize", {"messages": BEGUN, "continue_final_message": True})
    _, _, text = raw(server.url, "/detokenize", {"tokens": t["tokens"]})
    assert text["prompt"].endswith("<|im_start|>assistant\n" + BEGUN[1]["content"]), text
    _, _, closed = raw(server.url, "/tokenize", {"messages": BEGUN, "add_generation_prompt": False})
    assert closed["tokens"][: t["count"]] == t["tokens"] and closed["count"] > t["count"]
    args = dict(model=MODEL, messages=BEGUN, max_tokens=12, temperature=0,
                extra_body={"continue_final_message": True, "add_generation_prompt": False})
    r = client.chat.completions.create(**args)
    assert r.usage.prompt_tokens == t["count"]
    c = client.completions.create(model=MODEL, prompt=t["tokens"], max_tokens=12, temperature=0)
    answer = r.choices[0].message.content
    assert answer and answer == c.choices[0].text
    fresh = client.chat.completions.create(**{**args, "extra_body": {}})
    assert fresh.choices[0].message.content != answer
    streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        **{**args, "extra_body": {"continue_final_message": True}}, stream=True) if ch.choices)
    assert streamed == answer


def test_chat_echo_begins_the_reply_with_the_assistants_last_message(client, server):
    """vLLM's chat `echo`: with a final assistant message, the reply begins with its text
    (with `continue_final_message`, the whole message: begun text plus continuation, whole
    and streamed); after a user message there is nothing to echo; with tool calls it is a
    400 naming it."""
    args = dict(model=MODEL, messages=BEGUN, max_tokens=8, temperature=0)
    cont = {"continue_final_message": True}
    alone = client.chat.completions.create(**args, extra_body=cont).choices[0].message.content
    r = client.chat.completions.create(**args, extra_body={**cont, "echo": True})
    assert r.choices[0].message.content == BEGUN[1]["content"] + alone
    streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        **args, extra_body={**cont, "echo": True}, stream=True) if ch.choices)
    assert streamed == BEGUN[1]["content"] + alone
    plain = dict(model=MODEL, messages=BEGUN[:1], max_tokens=8, temperature=0)
    assert (client.chat.completions.create(**plain, extra_body={"echo": True}).choices[0]
            .message.content == client.chat.completions.create(**plain).choices[0].message.content)
    status, _, b = raw(server.url, "/v1/chat/completions", {
        **plain, "echo": True, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert status == 400 and b["error"]["param"] == "echo", b


@pytest.mark.parametrize("extra,messages,says", [
    ({"add_generation_prompt": True}, BEGUN, "cannot both be true"),
    ({"response_format": {"type": "json_object"}}, BEGUN, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
     BEGUN, "tools"),
    ({}, BEGUN[:1] + [{"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "tool calls"),
])
def test_continue_final_message_refusals_name_it(server, extra, messages, says):
    """A continuation that cannot be built is a 400 naming `continue_final_message`: with a
    new turn asked for too, with a grammar (which holds a reply from its start), after a
    message that made tool calls."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 4,
            "continue_final_message": True, **extra}
    status, _, b = raw(server.url, "/v1/chat/completions", body)
    assert status == 400, b
    assert_error_shape(b)
    assert b["error"]["param"] == "continue_final_message" and says in b["error"]["message"], b


@pytest.mark.parametrize("body,param", [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
])
def test_unimplemented_vllm_fields_are_refused_by_name(server, body, param):
    """A vLLM extension sluice does not implement is a 400 naming it, never silently ignored;
    sent at the value that asks for nothing, it is accepted."""
    req = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
    status, _, b = raw(server.url, "/v1/chat/completions", {**req, **body})
    assert status == 400 and b["error"]["param"] == param, b
    quiet = {"use_beam_search": False, "bad_words": [], "length_penalty": 1.0, "echo": False,
             "modalities": ["text"], "continue_final_message": False, "prompt_logprobs": None}
    status, _, b = raw(server.url, "/v1/chat/completions", {**req, **quiet})
    assert status == 200, b


def test_seed_reproducibility(client):
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=1.0, seed=1234)
    a = client.chat.completions.create(**args).choices[0].message.content
    b = client.chat.completions.create(**args).choices[0].message.content
    assert a == b
    c = client.chat.completions.create(**{**args, "seed": 4321}).choices[0].message.content
    assert c != a


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert "".join(lp.tokens) == r.choices[0].text



def test_logprob_bytes_join_into_the_text(client):
    """A token may hold part of a UTF-8 character (an emoji spans several): its `token` text
    is then U+FFFD, and its `bytes` are the token's own bytes, which joined across tokens give
    the answer, as OpenAI documents them."""
    r = client.chat.completions.create(model=MODEL, max_tokens=24, temperature=0,
                                       messages=[{"role": "user", "content": "Write three emoji."}],
                                       logprobs=True, top_logprobs=2)
    c = r.choices[0]
    content = c.logprobs.content
    assert any("\ufffd" in t.token for t in content), "the answer splits a character"
    joined = b"".join(bytes(t.bytes) for t in content)
    assert joined.decode("utf-8", "replace") == c.message.content
    for t in content:
        assert bytes(t.top_logprobs[0].bytes) == bytes(t.bytes)

def test_n_two(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16,
                                       temperature=1.0, seed=5, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    # Completion tokens add up over both choices; the prompt counts once.
    assert 2 <= r.usage.completion_tokens <= 32
    one = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    greedy = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10,
                                            temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_tokenize_and_detokenize(server):
    s, _, t = raw(server.url, "/tokenize", {"prompt": "Hello world"})
    assert s == 200 and t["count"] == len(t["tokens"]) > 0
    s, _, d = raw(server.url, "/detokenize", {"tokens": t["tokens"]})
    assert s == 200 and d["prompt"] == "Hello world"
    s, _, c = raw(server.url, "/tokenize", {"messages": MESSAGES})
    assert s == 200 and c["count"] > t["count"]


@pytest.mark.parametrize("body,param", [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop": ["a"] * 9}, "stop"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    # Only an assistant message that calls tools may leave out its content, as in OpenAI's API.
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]},
     "messages[1].content"),
    ({"logit_bias": {"1": 1000}}, "logit_bias"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"stop": [""]}, "stop"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 3}, "top_logprobs"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    req = {"model": MODEL, "messages": MESSAGES, **body}
    status, _, b = raw(server.url, "/v1/chat/completions", req)
    assert status == 400, b
    assert_error_shape(b)
    assert b["error"]["param"] == param, b
    assert b["error"]["type"] == "invalid_request_error"


def test_malformed_json_and_context_length(server, client):
    status, _, b = raw(server.url, "/v1/chat/completions", b'{"model": ')
    assert status == 400
    assert_error_shape(b)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5000)
    err = e.value.body
    assert err["code"] == "context_length_exceeded"
    assert "2048" in err["message"] and "5000" in err["message"], err


def test_prompts_past_the_bound_are_refused_through_a_gateway():
    """A replica started with `--max-prompt-tokens` refuses a longer prompt with a 400 the
    client reads as `context_length_exceeded`, also through a routing gateway in front, which
    lists the bound from the replica's card; prompts within it, or truncated to it, are served."""
    replica = Server("--max-prompt-tokens", "48", "--max-model-len", "512")
    gw = Server("--upstream", replica.url)
    try:
        long = [{"role": "user", "content": "Tell me about rivers. " * 20}]
        for url in (replica.url, gw.url):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            assert client.models.retrieve(MODEL).model_extra["max_prompt_tokens"] == 48
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model=MODEL, messages=long, max_tokens=4)
            err = e.value.body
            assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err
            assert "at most 48 tokens" in err["message"], err
            r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            assert r.usage.prompt_tokens <= 48
            r = client.completions.create(model=MODEL, prompt="river " * 100, max_tokens=2,
                                          extra_body={"truncate_prompt_tokens": 48})
            assert r.usage.prompt_tokens == 48
        _, _, m = raw(replica.url, "/metrics", method="GET")
        # Only the served prompts were prefilled: two short ones and two truncated to 48.
        assert series(m, "vllm:prompt_tokens_total") <= 4 * 48
    finally:
        gw.stop()
        assert replica.stop() == 0


def test_a_gateway_sends_each_prompt_to_a_replica_whose_bound_takes_it():
    """A mixed pool behind a gateway: one replica takes prompts of at most 48 tokens (as a
    slow GPU would be set), the other 256. A prompt the gateway's bytes / 4 estimate puts past
    48 goes to the second alone; one the estimate puts within 48 but the chat template makes
    longer (its default system prompt) is refused by the first and retried on the second
    before the client sees anything; one past both is refused with the larger bound named."""
    small = Server("--max-prompt-tokens", "48", "--max-model-len", "512")
    large = Server("--max-prompt-tokens", "256", "--max-model-len", "512")
    # Round-robin: the first replica gets every other first attempt it may take.
    gw = Server("--upstream", f"{small.url},{large.url}", "--policy", "round-robin")
    try:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve(MODEL).model_extra["max_prompt_tokens"] == 256

        def ask(text):
            raw_answer = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=2)
            return raw_answer.headers["x-sluice-replica"], raw_answer.parse()

        for _ in range(3):
            replica, r = ask("Tell me about rivers. " * 20)
            assert replica == large.url and 48 < r.usage.prompt_tokens <= 256, (replica, r.usage)
        for _ in range(4):
            replica, r = ask("Tell me about rivers. " * 5)
            assert replica == large.url and r.usage.prompt_tokens > 48, (replica, r.usage)
        _, _, m = raw(gw.url, "/metrics", method="GET")
        refused = [line for line in m.splitlines() if line.startswith(
            "sluice_gateway_upstream_requests_total") and f'replica="{small.url}"' in line
            and 'status="400"' in line]
        assert refused and float(refused[0].split()[-1]) >= 1, refused
        with pytest.raises(openai.BadRequestError) as e:
            ask("Tell me about rivers. " * 60)
        assert e.value.body["code"] == "context_length_exceeded", e.value.body
        assert "at most 256 tokens" in e.value.body["message"], e.value.body
        _, _, m = raw(small.url, "/metrics", method="GET")
        # The small replica prefilled nothing: it refused before any prefill.
        assert series(m, "vllm:prompt_tokens_total") == 0
    finally:
        gw.stop()
        assert small.stop() == 0
        assert large.stop() == 0


def test_unknown_model_and_route(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert e.value.body["code"] == "model_not_found"
    status, _, b = raw(server.url, "/v2/nothing")
    assert status == 404
    assert_error_shape(b)


def test_body_over_the_limit_is_413(server):
    import http.client
    import urllib.parse

    big = json.dumps({"model": MODEL, "prompt": "x" * (5 << 20)}).encode()
    u = urllib.parse.urlparse(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(big)))
    conn.endheaders()
    # The server answers as soon as it sees the declared length and stops reading.
    try:
        for i in range(0, len(big), 1 << 16):
            conn.send(big[i:i + (1 << 16)])
    except (BrokenPipeError, ConnectionResetError):
        pass
    r = conn.getresponse()
    assert r.status == 413
    assert_error_shape(json.loads(r.read()))


def test_metrics_and_openapi(server, client):
    def page():
        return raw(server.url, "/metrics", method="GET")[2]
    lengths = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens")
    before = page()
    counts = {n: (series(before, n + "_count"), series(before, n + "_sum")) for n in lengths}
    r = client.completions.create(model=MODEL, prompt="Hi there, how", max_tokens=3,
                                  extra_body={"ignore_eos": True})
    time.sleep(1.1)  # the request's second is over: a gateway would have observed it now
    text = page()
    # Each request's prompt and output lengths, as vLLM exports them: what an autoscaler reads
    # the spread of sequence lengths from.
    for name, tokens in zip(lengths, (r.usage.prompt_tokens, r.usage.completion_tokens)):
        count, total = counts[name]
        assert series(text, name + "_count") == count + 1, name
        assert series(text, name + "_sum") == total + tokens, name
    for name in ("vllm:num_requests_running", "vllm:time_to_first_token_seconds",
                 "vllm:prompt_tokens_total", "sluice_gateway_requests_total",
                 "sluice_engine_step_seconds"):
        assert name in text, name
    assert f'model_name="{MODEL}"' in text
    # A replica does not count its own requests' prompt bursts (only a routing gateway does:
    # a replica sees its share of a burst, which summed with the gateway's would count twice).
    assert "sluice_gateway_prompt_tokens_per_second_count{" not in text
    status, _, spec = raw(server.url, "/openapi.json")
    assert status == 200 and "/v1/chat/completions" in spec["paths"]


def test_api_keys_are_required_when_configured():
    keys = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    keys.write('[[tenants]]\nname = "a"\n[[keys]]\nkey = "sk-test-a"\ntenant = "a"\n')
    keys.close()
    s = Server("--api-keys", keys.name, "--max-model-len", "512")
    try:
        for key in (None, "sk-wrong"):
            headers = {"authorization": f"Bearer {key}"} if key else {}
            status, _, b = raw(s.url, "/v1/models", headers=headers)
            assert status == 401, b
            assert_error_shape(b)
            assert "sk-wrong" not in b["error"]["message"]
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sk-test-a", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0).models.list()
    finally:
        assert s.stop() == 0
        os.unlink(keys.name)


PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% endif %}")
DOCS_TEMPLATE = ("{% for d in documents %}<|im_start|>system\nDocument {{ d.title }}: {{ d.text }}"
                 "<|im_end|>\n{% endfor %}" + PLAIN_TEMPLATE)


def rendered(url, messages, **fields):
    """The chat's prompt as /tokenize renders it, as text (special tokens written out), and
    its token count."""
    status, _, t = raw(url, "/tokenize", {"messages": messages, **fields})
    assert status == 200, t
    return raw(url, "/detokenize", {"tokens": t["tokens"]})[2]["prompt"], t["count"]


def test_chat_templates_from_the_server_and_the_request(server):
    """`--chat-template` replaces the model's (a file, or the template itself): the prompt is
    the plain template's rendering, without the model's default system turn; one that does
    not compile stops the start with a message naming the flag. A request's `chat_template`
    is a 400 naming it unless the server trusts request templates; trusted, it renders the
    prompt, with `documents` as its variable (a template that does not read them ignores
    them; documents that are not a list of objects are a 400)."""
    hi = [{"role": "user", "content": "Hi"}]
    plain = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    f = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
    f.write(PLAIN_TEMPLATE)
    f.close()
    for given in (f.name, PLAIN_TEMPLATE):
        s = Server("--chat-template", given, "--max-model-len", "512")
        try:
            assert rendered(s.url, hi)[0] == plain
        finally:
            assert s.stop() == 0
    os.unlink(f.name)
    bad = subprocess.run([binary(), "serve", "--port", "0", "--chat-template", "{% for %}",
                          "--model-dir", os.environ.get("SLUICE_MODEL_DIR", "models/cache")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--chat-template" in bad.stderr, bad.stderr[-2000:]
    body = {"model": MODEL, "messages": hi, "max_tokens": 1, "chat_template": PLAIN_TEMPLATE}
    status, _, b = raw(server.url, "/v1/chat/completions", body)
    assert status == 400 and b["error"]["param"] == "chat_template", b
    docs = [{"title": "A", "text": "Rivers flow."}, {"title": "B", "text": "Seas are salty."}]
    status, _, b = raw(server.url, "/tokenize", {"messages": hi, "chat_template": PLAIN_TEMPLATE})
    assert status == 400 and b["error"]["param"] == "chat_template", b
    s = Server("--trust-request-chat-template", "--max-model-len", "512")
    try:
        with_docs = {"chat_template": DOCS_TEMPLATE, "documents": docs}
        text, count = rendered(s.url, hi, **with_docs)
        assert text == ("<|im_start|>system\nDocument A: Rivers flow.<|im_end|>\n<|im_start|>"
                        "system\nDocument B: Seas are salty.<|im_end|>\n" + plain), text
        status, _, b = raw(s.url, "/v1/chat/completions", {**body, **with_docs})
        assert status == 200 and b["usage"]["prompt_tokens"] == count, b
        text, count = rendered(s.url, hi, chat_template=PLAIN_TEMPLATE)
        status, _, b = raw(s.url, "/v1/chat/completions", body)
        assert text == plain and b["usage"]["prompt_tokens"] == count, b
        status, _, b = raw(s.url, "/v1/chat/completions", {**body, "chat_template": "{% for %}"})
        assert status == 400 and b["error"]["param"] == "chat_template", b
        own = raw(s.url, "/tokenize", {"messages": hi})[2]["count"]
        status, _, b = raw(s.url, "/v1/chat/completions",
                           {"model": MODEL, "messages": hi, "max_tokens": 1, "documents": docs})
        assert status == 200 and b["usage"]["prompt_tokens"] == own, b
        for wrong in ([1, 2], {"title": "A"}, ["text"]):
            status, _, b = raw(s.url, "/v1/chat/completions",
                               {"model": MODEL, "messages": hi, "documents": wrong})
            assert status == 400 and b["error"]["param"] == "documents", b
    finally:
        assert s.stop() == 0


def metrics(url):
    with urllib.request.urlopen(url + "/metrics") as r:
        return r.read().decode()


def test_full_queue_is_429_with_retry_after_and_drain_is_503():
    s = Server("--max-in-flight", "1", "--max-queue", "0", "--max-model-len", "512",
               "--drain-timeout", "30s")
    try:
        long = {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": 200,
                "ignore_eos": True}
        results = {}

        def run_long():
            results["long"] = raw(s.url, "/v1/completions", long)

        t = threading.Thread(target=run_long)
        t.start()
        # Wait until the long request holds the only slot (the engine runs it).
        deadline = time.time() + 30
        while "vllm:num_requests_running{model_name=\"%s\"} 1" % MODEL not in metrics(s.url):
            assert time.time() < deadline and t.is_alive(), results
            time.sleep(0.02)
        status, hdrs, b = raw(s.url, "/v1/completions",
                              {"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert status == 429, b
        assert_error_shape(b)
        assert int(hdrs.get("Retry-After") or hdrs.get("retry-after")) >= 1
        # Drain: new requests get 503 while the long one finishes; then exit 0.
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        status, _, b = raw(s.url, "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert status == 503
        assert_error_shape(b)
        t.join(timeout=120)
        status, _, body = results["long"]
        assert status == 200 and body["usage"]["completion_tokens"] == 200
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()


def test_error_after_streaming_began_is_an_sse_event():
    s = Server("--request-timeout", "300ms", "--max-model-len", "1024")
    try:
        req = urllib.request.Request(
            s.url + "/v1/completions",
            data=json.dumps({"model": MODEL, "prompt": "Once", "max_tokens": 900,
                             "ignore_eos": True, "stream": True}).encode(),
            headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
            events = [l[len("data: "):] for l in r.read().decode().splitlines()
                      if l.startswith("data: ")]
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])
        assert_error_shape(err)
        assert any("choices" in json.loads(e) for e in events[:-2])
    finally:
        assert s.stop() == 0
