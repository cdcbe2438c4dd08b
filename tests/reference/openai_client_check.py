#!/usr/bin/env python3
"""The official `openai` Python client drives `kiln serve`: completions, chat completions,
streaming (SSE), n > 1, usage, logprobs / top_logprobs (both endpoints, streamed and not), echo,
logit_bias, frequency / presence penalties, an absent model, and the client's error classes for
bad requests and for the OpenAI parameters kiln refuses (suffix, tools, response_format, ...).

A model directory comes from `kiln train` (llama-tiny, two steps on a small text, as
hf_load_check does); `kiln serve` runs it on a free loopback port with an API key. Greedy
requests must give the same text streamed and not streamed. Exit 77 (CTest's
SKIP_RETURN_CODE) when the `openai` package is not installed.

Run:  /usr/bin/python3 tests/reference/openai_client_check.py [--kiln build/kiln]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import urllib.request

from kiln_fixture import expect, serving, train_tiny

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import openai
except ImportError:
    print("SKIP openai_client_check: the openai package is not installed "
          "(/usr/bin/python3 -m pip install --break-system-packages openai)")
    sys.exit(SKIP)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model_dir = train_tiny(args.kiln, work)
        with serving(args.kiln, model_dir, "--api-key", "test-key", "--served-model-name", "tiny",
                     "--kv-cache-mem", "64M") as (_, port):
            check(f"http://127.0.0.1:{port}")
            one = greedy_texts(f"http://127.0.0.1:{port}")
        # Tensor parallelism and disaggregated serving: the same checks against `mpirun -np 2 kiln
        # serve --tp 2` and `--disaggregate 1:1` / `2:1`, and the same greedy text as one process.
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            print("note: no mpirun; the --tp 2 pass is skipped")
        else:
            launcher = (mpirun, "-np", "2", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader")
            with serving(args.kiln, model_dir, "--tp", "2", "--api-key", "test-key", "--served-model-name", "tiny",
                         "--kv-cache-mem", "64M", launcher=launcher) as (_, port):
                check(f"http://127.0.0.1:{port}")
                two = greedy_texts(f"http://127.0.0.1:{port}")
                expect(two == one, f"greedy completions at --tp 2 equal one process's ({two} vs {one})")
            # Disaggregated prefill and decode: 1 prefill rank and the decode rank, then 2 prefill
            # ranks (correctness only); the same checks and the same greedy text.
            for spec, ranks in (("1:1", "2"), ("2:1", "3")):
                launcher = (mpirun, "-np", ranks, "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader")
                with serving(args.kiln, model_dir, "--disaggregate", spec, "--api-key", "test-key",
                             "--served-model-name", "tiny", "--kv-cache-mem", "64M", launcher=launcher) as (_, port):
                    check(f"http://127.0.0.1:{port}")
                    dis = greedy_texts(f"http://127.0.0.1:{port}")
                    expect(dis == one, f"greedy completions at --disaggregate {spec} equal one process's ({dis} vs {one})")
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        metrics = r.read().decode()
                    expect("kiln_disagg_kv_transfer_bytes_total" in metrics and
                           "kiln_disagg_prefills_failed_total 0" in metrics,
                           f"/metrics reports the transfers at --disaggregate {spec}, none failed")
    print("PASS openai_client_check")


def greedy_texts(base):
    client = openai.OpenAI(base_url=base + "/v1", api_key="test-key", max_retries=0, timeout=30)
    prompts = ["And God said", "In the beginning", "the face of the waters", "Let there be"]
    return [client.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0).choices[0].text
            for p in prompts]


def check(base):
    client = openai.OpenAI(base_url=base + "/v1", api_key="test-key", max_retries=0, timeout=30)
    models = client.models.list()
    expect([m.id for m in models.data] == ["tiny"], "models.list() names the served model")

    c = client.completions.create(model="tiny", prompt="And God said", max_tokens=12, temperature=0, seed=1)
    expect(c.object == "text_completion" and len(c.choices) == 1, "completions.create returns one choice")
    expect(c.usage.completion_tokens >= 1 and c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens,
           f"usage adds up ({c.usage})")
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model="tiny", prompt="And God said", max_tokens=12, temperature=0, seed=1, stream=True) if ch.choices)
    expect(streamed == c.choices[0].text, f"streamed completion equals the non-streamed one ({streamed!r})")

    many = client.completions.create(model="tiny", prompt="the face", max_tokens=8, temperature=0.9, top_p=0.95,
                                      n=3, seed=7, stop=["\n"])
    expect(sorted(ch.index for ch in many.choices) == [0, 1, 2], "n=3 gives choices 0, 1, 2")
    again = client.completions.create(model="tiny", prompt="the face", max_tokens=8, temperature=0.9, top_p=0.95,
                                       n=3, seed=7, stop=["\n"])
    expect([ch.text for ch in many.choices] == [ch.text for ch in again.choices], "the same seed gives the same samples")
    expect(all("\n" not in ch.text for ch in many.choices), "stop strings are cut from the text")

    chat = client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "Answer."},
                                                                  {"role": "user", "content": "Who made light?"}],
                                          max_tokens=10, temperature=0)
    expect(chat.object == "chat.completion" and chat.choices[0].message.role == "assistant",
           "chat.completions.create returns an assistant message")
    parts = []
    for ch in client.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "Answer."},
                                                                     {"role": "user", "content": "Who made light?"}],
                                             max_tokens=10, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.usage:
            expect(ch.usage.completion_tokens >= 1, "the streamed chat ends with a usage chunk")
    expect("".join(parts) == (chat.choices[0].message.content or ""), "streamed chat equals the non-streamed one")

    def raises(cls, fn, what):
        try:
            fn()
        except cls as e:
            expect(True, f"{what} -> {cls.__name__} ({e.status_code})")
            return
        raise SystemExit(f"FAIL: {what} did not raise {cls.__name__}")

    raises(openai.NotFoundError, lambda: client.completions.create(model="nope", prompt="x", max_tokens=2),
           "an unknown model")
    raises(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt="x", max_tokens=-1),
           "negative max_tokens")
    raises(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt="x", max_tokens=10**9),
           "huge max_tokens")
    raises(openai.BadRequestError, lambda: client.completions.create(model="tiny", prompt="light " * 400, max_tokens=2),
           "a prompt longer than the context")
    bad_key = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    raises(openai.AuthenticationError, lambda: bad_key.completions.create(model="tiny", prompt="x", max_tokens=2),
           "a wrong API key")
    c2 = client.completions.create(model="tiny", prompt="And", max_tokens=3, temperature=0)
    expect(len(c2.choices) == 1, "the server still serves after the errors")
    check_new_parameters(client, base, raises)


def check_new_parameters(client, base, raises):
    # logprobs on completions: one entry per token, the sampled token among its top_logprobs.
    c = client.completions.create(model="tiny", prompt="And God said", max_tokens=6, temperature=0, logprobs=3)
    lp = c.choices[0].logprobs
    expect(len(lp.tokens) == c.usage.completion_tokens == len(lp.token_logprobs) == len(lp.top_logprobs)
           == len(lp.text_offset), f"completions logprobs: one entry per generated token ({len(lp.tokens)})")
    expect(all(v <= 0 for v in lp.token_logprobs), "token_logprobs are log-probabilities")
    expect(all(tok in top and len(top) <= 4 for tok, top in zip(lp.tokens, lp.top_logprobs)),
           "top_logprobs hold the 3 most likely and the token itself")
    expect(all(abs(v - max(top.values())) < 1e-6 for v, top in zip(lp.token_logprobs, lp.top_logprobs)),
           "greedy tokens are the most likely ones")
    streamed = []
    for ch in client.completions.create(model="tiny", prompt="And God said", max_tokens=6, temperature=0, logprobs=3,
                                        stream=True):
        if ch.choices and ch.choices[0].logprobs:
            streamed += ch.choices[0].logprobs.token_logprobs
    expect(len(streamed) == len(lp.token_logprobs) and all(abs(a - b) < 1e-4 for a, b in zip(streamed, lp.token_logprobs)),
           "streamed logprobs equal the non-streamed ones")

    # echo + logprobs with max_tokens 1: lm-evaluation-harness's loglikelihood request.
    e = client.completions.create(model="tiny", prompt="And the earth was without form", max_tokens=1, temperature=0,
                                  logprobs=1, echo=True, seed=1234)
    elp = e.choices[0].logprobs
    n_prompt = e.usage.prompt_tokens
    expect(e.choices[0].text.startswith("And the earth was without form"), "echo puts the prompt before the completion")
    expect(len(elp.token_logprobs) == n_prompt + 1 and elp.token_logprobs[0] is None and elp.top_logprobs[0] is None,
           f"echo: the prompt's {n_prompt} tokens (the first without a logprob) and the generated one")
    expect(all(v is not None and v <= 0 for v in elp.token_logprobs[1:]), "echo: prompt token logprobs")
    expect("".join(elp.tokens).startswith(e.choices[0].text) and elp.text_offset[0] == 0, "echo: tokens and offsets cover the text")
    zero = client.completions.create(model="tiny", prompt="And the earth was without form", max_tokens=0, logprobs=0,
                                     echo=True)
    expect(zero.choices[0].text == "And the earth was without form" and zero.usage.completion_tokens == 0 and
           all(abs(a - b) < 1e-4 for a, b in zip(zero.choices[0].logprobs.token_logprobs[1:], elp.token_logprobs[1:n_prompt])),
           "echo with max_tokens 0 scores the prompt alone, with the same logprobs")

    # chat logprobs.
    msgs = [{"role": "user", "content": "Who made light?"}]
    ch = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                        top_logprobs=2)
    content = ch.choices[0].logprobs.content
    expect(len(content) >= 1 and all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token and
                                     bytes(t.bytes).decode("utf-8", "replace") == t.token for t in content),
           f"chat logprobs: {len(content)} tokens with token, logprob, bytes and 2 top_logprobs")
    parts = []
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                                top_logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            parts += [t.token for t in chunk.choices[0].logprobs.content]
    expect(parts == [t.token for t in content], "streamed chat logprobs equal the non-streamed ones")

    # logit_bias: +100 on one token makes greedy decoding repeat it. (Its text: echo of the id.)
    probe = client.completions.create(model="tiny", prompt=[65], max_tokens=0, logprobs=0, echo=True)
    token_text = probe.choices[0].logprobs.tokens[0]
    b = client.completions.create(model="tiny", prompt="And God said", max_tokens=5, temperature=0,
                                  logit_bias={"65": 100}, logprobs=0)
    expect(b.choices[0].logprobs.tokens == [token_text] * 5, f"logit_bias +100 forces token 65 ({token_text!r})")
    # Penalties change greedy text on this repetitive model; a repeated run gives the same.
    plain = client.completions.create(model="tiny", prompt="And God said", max_tokens=24, temperature=0).choices[0].text
    for kw in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        t1 = client.completions.create(model="tiny", prompt="And God said", max_tokens=24, temperature=0, **kw)
        t2 = client.completions.create(model="tiny", prompt="And God said", max_tokens=24, temperature=0, **kw)
        expect(t1.choices[0].text != plain and t1.choices[0].text == t2.choices[0].text,
               f"{kw} changes the greedy text, deterministically")

    # model may be omitted (the openai client always sends it: a raw request).
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({"prompt": "And", "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer test-key"})
    with urllib.request.urlopen(req, timeout=30) as r:
        expect(json.loads(r.read())["model"] == "tiny", "a request without 'model' is served by the served model")

    # Refused by name.
    for what, fn in [
        ("suffix", lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2, suffix="y")),
        ("best_of != n", lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2, best_of=2)),
        ("logprobs 6", lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=6)),
        ("a logit_bias id past the vocabulary",
         lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2, logit_bias={"100000": 1})),
        ("presence_penalty 3", lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                                                  presence_penalty=3)),
        ("tools", lambda: client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=2,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])),
        ("response_format json_object", lambda: client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=2, response_format={"type": "json_object"})),
        ("top_logprobs without logprobs", lambda: client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=2, top_logprobs=2)),
        ("an unknown parameter", lambda: client.completions.create(model="tiny", prompt="x", max_tokens=2,
                                                                    extra_body={"min_p": 0.1})),
    ]:
        raises(openai.BadRequestError, fn, what)
    ok = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, response_format={"type": "text"})
    expect(len(ok.choices) == 1, "response_format {'type': 'text'} is the default and accepted")


if __name__ == "__main__":
    main()
