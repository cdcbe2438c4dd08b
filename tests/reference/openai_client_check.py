#!/usr/bin/env python3
"""The official `openai` Python client drives `kiln serve`: completions, chat completions,
streaming (SSE), n > 1, usage, and the client's error classes for bad requests.

A model directory comes from `kiln train` (llama-tiny, two steps on a small text, as
hf_load_check does); `kiln serve` runs it on a free loopback port with an API key. Greedy
requests must give the same text streamed and not streamed. Exit 77 (CTest's
SKIP_RETURN_CODE) when the `openai` package is not installed.

Run:  /usr/bin/python3 tests/reference/openai_client_check.py [--kiln build/kiln]
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import openai
except ImportError:
    print("SKIP openai_client_check: the openai package is not installed "
          "(/usr/bin/python3 -m pip install --break-system-packages openai)")
    sys.exit(SKIP)

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And God said, Let there be light: and there was light.\n") * 40


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def expect(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(TEXT)
        model_dir = os.path.join(work, "tiny")
        run([args.kiln, "--threads", "1", "train", "--preset", "llama-tiny", "--text", os.path.join(work, "corpus.txt"),
             "--data", os.path.join(work, "data"), "--vocab-size", "300", "--steps", "2", "--batch", "2", "--seq", "32",
             "--eval-every", "0", "--out", model_dir])
        port = free_port()
        server = subprocess.Popen([args.kiln, "--threads", "1", "serve", "--model", model_dir, "--port", str(port),
                                   "--api-key", "test-key", "--served-model-name", "tiny", "--kv-cache-mem", "64M"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1)
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit("kiln serve exited:\n" + server.stdout.read())
                    time.sleep(0.05)
            check(base)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    print("PASS openai_client_check")


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


if __name__ == "__main__":
    main()
