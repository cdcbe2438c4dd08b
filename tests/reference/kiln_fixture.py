"""What the Python checks and scripts share (standard library only): running kiln, training a
tiny model in seconds, and `kiln serve` on a free loopback port.

    from kiln_fixture import TEXT, run, expect, train_tiny, serving
    with tempfile.TemporaryDirectory() as work:
        model = train_tiny(kiln, work)
        with serving(kiln, model, "--served-model-name", "tiny") as (server, port):
            ...
"""
import contextlib
import os
import re
import subprocess

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And God said, Let there be light: and there was light.\n") * 40


def run(cmd, env=None):
    """Runs cmd; on failure prints its output's tail and exits naming the command."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout[-6000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout


def expect(cond, what):
    if not cond:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def train_tiny(kiln, work, steps=2, batch=2, seq=32, preset="llama-tiny", name="tiny", text=TEXT):
    """A model directory WORK/NAME from `kiln train` on `text` (BPE vocabulary 300); the
    prepared data goes to WORK/data, so models trained in one folder share a tokenizer."""
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(text)
    out = os.path.join(work, name)
    run([kiln, "--threads", "1", "train", "--preset", preset, "--text", corpus, "--data", os.path.join(work, "data"),
         "--vocab-size", "300", "--steps", str(steps), "--batch", str(batch), "--seq", str(seq), "--eval-every", "0",
         "--out", out])
    return out


@contextlib.contextmanager
def serving(kiln, model, *args, launcher=()):
    """`kiln serve --model MODEL --port 0 ARGS...`: yields (process, port) once it listens; kills
    it on the way out unless it has exited. `launcher`: a prefix such as mpirun's, for --tp; it is
    stopped with SIGTERM (which mpirun forwards, so the ranks end), not killed."""
    server = subprocess.Popen([*launcher, kiln, "--threads", "1", "serve", "--model", model, "--port", "0", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        seen = []
        for line in server.stdout:
            seen.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            raise SystemExit("kiln serve exited before listening:\n" + "".join(seen))
        yield server, port
    finally:
        if server.poll() is None:
            if launcher:
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            if server.poll() is None:
                server.kill()
                server.wait()
