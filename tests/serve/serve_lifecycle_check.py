#!/usr/bin/env python3
"""`kiln serve` under slow clients, oversized and bad requests, and SIGTERM (standard library only).

A tiny model comes from `kiln train` (two steps on a small text). Then, against one server
with 4 HTTP worker threads and a 2 s request timeout:
  1. 150 connections send half a header and keep trickling bytes; /health and a completion
     still answer (each within a 20 s liveness bound: before the connection gate they waited
     for the slow clients' read timeouts, or forever for clients that trickle);
  2. a half-sent request gets 408 once the request timeout passes; one past --max-connections
     gets 503;
  3. requests that once crashed the server (max_tokens at the edge of int64, a body nested
     100,000 deep, type errors in nested fields) get 4xx JSON errors and the server lives on;
  4. SIGTERM while a stream runs: the stream ends with a final error event and [DONE], and the
     process exits 0 within --drain-timeout + 5 s.

Run:  python3 tests/serve/serve_lifecycle_check.py --kiln build/kiln
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And God said, Let there be light: and there was light.\n") * 40
LIVENESS_S = 20


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def expect(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def request(port, method, path, body=None, timeout=LIVENESS_S):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def raw(port, data, timeout=LIVENESS_S):
    """Sends raw bytes, returns what comes back until the server closes (or the timeout)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        pass
    s.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write(TEXT)
        model = os.path.join(work, "tiny")
        run([args.kiln, "--threads", "1", "train", "--preset", "llama-tiny", "--text", os.path.join(work, "corpus.txt"),
             "--data", os.path.join(work, "data"), "--vocab-size", "300", "--steps", "2", "--batch", "2", "--seq", "32",
             "--eval-every", "0", "--out", model])
        server = subprocess.Popen([args.kiln, "--threads", "1", "serve", "--model", model, "--port", "0",
                                   "--served-model-name", "tiny", "--kv-cache-mem", "64M", "--http-threads", "4",
                                   "--request-timeout", "2", "--max-connections", "200", "--drain-timeout", "3"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        port = None
        for line in server.stdout:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        expect(port is not None, "kiln serve listens")
        try:
            check(server, port)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


def check(server, port):
    # 1. Slow clients.
    slow = []
    for _ in range(150):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    for s in slow:
        s.sendall(b"X-Trickle: 1\r\n")
    t0 = time.monotonic()
    status, _ = request(port, "GET", "/health")
    expect(status == 200, f"/health answers beside 150 half-header connections ({time.monotonic() - t0:.3f} s)")
    status, body = request(port, "POST", "/v1/completions",
                           json.dumps({"model": "tiny", "prompt": "And God said", "max_tokens": 4, "temperature": 0}))
    expect(status == 200 and json.loads(body)["choices"][0]["finish_reason"] in ("length", "stop"),
           "a completion is served beside them")
    for s in slow:
        s.close()

    # 2. Deadlines and the connection limit.
    reply = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    expect(reply.startswith(b"HTTP/1.1 408"), "a request that does not arrive within --request-timeout gets 408")
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
    time.sleep(0.3)
    reply = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    expect(reply.startswith(b"HTTP/1.1 503"), "a connection past --max-connections gets 503")
    for s in held:
        s.close()
    time.sleep(0.3)

    # 3. Requests that once killed the server.
    bad = [
        {"prompt": "x", "max_tokens": 2**63 - 1},
        {"prompt": "x", "max_tokens": 2**64 - 1},
        {"prompt": "x", "max_tokens": -2**63},
        {"prompt": "x", "n": 2**63 - 1},
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}},
        {"prompt": "x", "seed": 1e300},
        {"prompt": [2**40]},
    ]
    for b in bad:
        b["model"] = "tiny"
        status, body = request(port, "POST", "/v1/completions", json.dumps(b))
        expect(400 <= status < 500 and "error" in json.loads(body), f"{json.dumps(b)[:60]} -> {status}")
    deep = "[" * 100000 + "]" * 100000
    status, body = request(port, "POST", "/v1/completions", '{"model": "tiny", "prompt": ' + deep + "}")
    expect(status == 400 and "deeper" in json.loads(body)["error"]["message"], "a body nested 100,000 deep -> 400")
    status, _ = request(port, "GET", "/health")
    expect(status == 200 and server.poll() is None, "the server lives on")

    # 4. SIGTERM drains: a running stream gets a final error event, the process exits 0.
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=LIVENESS_S)
    c.request("POST", "/v1/completions",
              body=json.dumps({"model": "tiny", "prompt": "And", "max_tokens": 200, "stream": True, "ignore_eos": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    expect(r.status == 200, "a stream starts")
    first = b""
    while not first.startswith(b"data: "):
        first = r.readline()
        if not first:
            break
    expect(first.startswith(b"data: "), "its first event arrives")
    t0 = time.monotonic()
    server.send_signal(signal.SIGTERM)
    rest = r.read().decode()
    events = [line[6:] for line in rest.splitlines() if line.startswith("data: ")]
    expect(len(events) >= 2 and events[-1] == "[DONE]", "the stream ends with [DONE]")
    err = json.loads(events[-2])
    expect("error" in err and "shutting down" in err["error"]["message"], f"and a final error event: {events[-2]}")
    rc = server.wait(timeout=3 + 5)
    expect(rc == 0, f"kiln serve exits 0 after SIGTERM ({time.monotonic() - t0:.2f} s)")
    out = server.stdout.read()
    expect("draining" in out, "and says it drained")


if __name__ == "__main__":
    sys.exit(main())
