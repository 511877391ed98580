#!/usr/bin/env python3
"""End-to-end checks of speculative decoding in `lamina serve` on the bundled
model (models/stories260K.gguf), over plain HTTP.

Three servers: one plain, one started with `--spec ngram --draft-max 6`,
one with `--draft-model` (a Q4_0 requantization of the bundled model, made
here with `lamina quantize`) for checks 1 to 3.

  1. Greedy identity: for many prompts (copy-heavy ones that repeat
     themselves, and ordinary ones), with stop strings and n = 2, the
     speculating server's text and finish reasons equal the plain server's,
     with speculation on (the default), off ("speculative": false) and at
     "draft_max": 1; streamed text equals the non-streamed text.
  2. /metrics: lamina_spec_proposed_tokens_total and
     lamina_spec_accepted_tokens_total grow with speculating requests
     (accepted <= proposed, some accepted), and not with a request sent
     with "speculative": false; with "draft_max": 1 each verifying pass
     proposes one token. The plain server reports 0 for both.
  3. Sampling: the same seed gives the same text twice.
  4. Bad fields: "draft_max" out of [0, 64] and a non-boolean "speculative"
     are 400s naming the field.
  5. Both servers exit 0 on SIGTERM with nothing from the sanitizers.
  6. `lamina bench spec` on a copy-heavy prompt: exit 0, outputs identical,
     tokens proposed and accepted (prompt lookup, and the draft model).
  7. A draft whose tokenizer differs (a copy of the bundled model with one
     token's text changed) is refused by `lamina run` with an error naming
     the token; --spec ngram with --draft-model is a usage error.
  (The draft runs at a set price, --draft-cost 0.2, so whether it guesses
  does not depend on the time its passes took on a loaded machine.)
  8. `lamina bench serve --draft-model`: alone the draft proposes and is
     accepted, and the acceptance is reported; with 8 requests at once and
     16 tokens per iteration it stands aside (a share of decode passes
     that verify a proposal under half the one alone).
"""
import http.client
import json
import os
import re
import subprocess
import sys

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import result, summary  # noqa: E402


class Server(testenv.Server):
    def __init__(self, *args):
        super().__init__([LAMINA, "serve", "-m", MODEL, "-t", "1", "-c", "256", "--ctx-extend", *args])


def request(srv, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        if body is not None:
            body = json.dumps(body).encode()
        c.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def complete(srv, body):
    status, data = request(srv, "POST", "/v1/completions", body)
    if status != 200:
        raise RuntimeError("status %d: %s" % (status, data[:300]))
    j = json.loads(data)
    return [(ch["text"], ch["finish_reason"]) for ch in sorted(j["choices"], key=lambda c: c["index"])]


def complete_stream(srv, body):
    b = dict(body)
    b["stream"] = True
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(b).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = ""
        for raw in r.read().decode().splitlines():
            if raw.startswith("data: ") and raw != "data: [DONE]":
                ev = json.loads(raw[6:])
                for ch in ev.get("choices", []):
                    text += ch.get("text") or ""
        return text
    finally:
        c.close()


def metrics(srv):
    return srv.metrics()


PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time, there was",
    "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the",
    "Lily and Ben went to the park. They saw a big tree.",
    "One day, a bird flew over the house.",
    "Sue said, \"I want to play with you.\" Sue said, \"I want to",
    "The sun was hot. The sun was hot. The sun was hot.",
    "Max liked to run and jump. He ran to the park and jumped. He ran to the",
]


def bodies():
    out = []
    for i, p in enumerate(PROMPTS):
        b = {"prompt": p, "max_tokens": 10 + (i * 17) % 70, "temperature": 0}
        if i % 3 == 1:
            b["stop"] = [" park", "\n"]
        if i % 4 == 2:
            b["n"] = 2
        out.append(b)
    return out


def check_identity(plain, spec):
    want = [complete(plain, b) for b in bodies()]
    for label, extra in [("on", {}), ("off", {"speculative": False}), ("draft_max 1", {"draft_max": 1})]:
        got = [complete(spec, dict(b, **extra)) for b in bodies()]
        bad = [i for i in range(len(want)) if want[i] != got[i]]
        result("greedy identity, speculation %s: %d requests" % (label, len(want)), not bad,
               "differs at %s: %s vs %s" % (bad, [want[i] for i in bad[:2]], [got[i] for i in bad[:2]]))
    streamed = [complete_stream(spec, b) for b in bodies() if "n" not in b]
    nonstream = [w[0][0] for w, b in zip(want, bodies()) if "n" not in b]
    result("streamed text equals the plain text", streamed == nonstream, "%s vs %s" % (streamed[:2], nonstream[:2]))


def check_metrics(plain, spec):
    m0 = metrics(spec)
    pk, ak, sk = ("lamina_spec_proposed_tokens_total", "lamina_spec_accepted_tokens_total",
                  "lamina_spec_verify_steps_total")
    result("/metrics names the speculation counters", pk in m0 and ak in m0 and sk in m0, sorted(m0)[:50])
    if pk not in m0:
        return
    body = {"prompt": PROMPTS[1], "max_tokens": 60, "temperature": 0}
    complete(spec, body)
    m1 = metrics(spec)
    dp, da = m1[pk] - m0[pk], m1[ak] - m0[ak]
    result("a copy-heavy request proposes and accepts", dp > 0 and 0 < da <= dp, "proposed %s accepted %s" % (dp, da))
    complete(spec, dict(body, speculative=False))
    m2 = metrics(spec)
    result("\"speculative\": false proposes nothing", m2[pk] == m1[pk], "%s -> %s" % (m1[pk], m2[pk]))
    complete(spec, dict(body, draft_max=1))
    m3 = metrics(spec)
    dp, ds = m3[pk] - m2[pk], m3[sk] - m2[sk]
    result("\"draft_max\": 1 proposes one token per verifying pass", dp > 0 and dp == ds, "%s over %s" % (dp, ds))
    mp = metrics(plain)
    result("a server without a proposer counts none", mp.get(pk) == 0 and mp.get(ak) == 0, mp.get(pk))


def check_sampled(spec):
    body = {"prompt": PROMPTS[0], "max_tokens": 60, "temperature": 0.9, "seed": 5}
    a, b = complete(spec, body), complete(spec, body)
    result("a seed reproduces a sampled, speculated text", a == b, "%s vs %s" % (a, b))


def check_errors(spec):
    for body, field in [({"draft_max": 65}, "draft_max"), ({"draft_max": -1}, "draft_max"),
                        ({"speculative": "yes"}, "speculative")]:
        b = dict({"prompt": "Hi", "max_tokens": 4}, **body)
        status, data = request(spec, "POST", "/v1/completions", b)
        ok = status == 400
        try:
            ok = ok and json.loads(data)["error"].get("param") == field
        except (ValueError, KeyError):
            ok = False
        result("400 for %s" % json.dumps(body), ok, "%d %s" % (status, data[:200]))


def check_bench_spec():
    prompt = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Lily had a big dog. Tom had"
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "lamina-e2e-spec-%d.txt" % os.getpid())
    with open(path, "w") as f:
        f.write(prompt)
    try:
        p = subprocess.run([LAMINA, "bench", "spec", "-m", MODEL, "-f", path, "-n", "60", "-r", "2", "-t", "1"],
                           capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    m = re.findall(r"^\| \d+ \| [\d.]+ \| [\d.]+ \| (\d+) \| (\d+) \|", p.stdout, re.M)
    ok = p.returncode == 0 and "outputs identical" in p.stdout and len(m) == 2 and int(m[0][1]) > 0
    result("lamina bench spec: identical outputs, proposals accepted", ok, p.stdout + p.stderr)


def make_drafts(tmp):
    """A Q4_0 requantization of the bundled model, and a copy with token
    300's text changed (its length kept)."""
    q4 = os.path.join(tmp, "draft-q4_0.gguf")
    p = subprocess.run([LAMINA, "quantize", MODEL, q4, "Q4_0", "-t", "1"], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    data = bytearray(open(MODEL, "rb").read())
    piece = "\u2581ha".encode()  # token 300 of the bundled vocabulary
    at = data.find(len(piece).to_bytes(8, "little") + piece)
    if at < 0:
        raise RuntimeError("token 300 not found in the model file")
    data[at + 8 + len(piece) - 1] = ord("x")
    bad = os.path.join(tmp, "draft-bad-vocab.gguf")
    open(bad, "wb").write(bytes(data))
    return q4, bad


def check_draft_cli(q4, bad):
    p = subprocess.run([LAMINA, "run", "-m", MODEL, "-p", "Once", "-n", "4", "-t", "1", "--draft-model", bad],
                       capture_output=True, text=True, timeout=120)
    result("a draft with another tokenizer is refused, naming the token",
           p.returncode != 0 and "token 300 differs" in p.stderr, p.stderr[-400:])
    p = subprocess.run([LAMINA, "run", "-m", MODEL, "-p", "Once", "-n", "4", "--spec", "ngram", "--draft-model", q4],
                       capture_output=True, text=True, timeout=120)
    result("--spec ngram with --draft-model is a usage error", p.returncode == 2 and "exclude" in p.stderr,
           p.stderr[-400:])
    prompt = "Tom had a red ball. Lily had a big dog. Tom had"
    path = os.path.join(os.path.dirname(q4), "prompt.txt")
    with open(path, "w") as f:
        f.write(prompt)
    p = subprocess.run([LAMINA, "bench", "spec", "-m", MODEL, "-f", path, "-n", "60", "-r", "2", "-t", "1",
                        "--draft-model", q4, "--draft-cost", "0.2"], capture_output=True, text=True, timeout=300)
    m = re.findall(r"^\| \d+ \| [\d.]+ \| [\d.]+ \| (\d+) \| (\d+) \|", p.stdout, re.M)
    ok = (p.returncode == 0 and "outputs identical" in p.stdout and len(m) == 2 and int(m[0][1]) > 0 and
          "draft pass: 0.200 of a model pass" in p.stdout)
    result("lamina bench spec --draft-model: identical outputs, proposals accepted", ok, p.stdout + p.stderr)


def check_bench_serve_draft(q4):
    """The draft under bench serve: alone it proposes and is accepted; with
    8 requests at once and a budget of 16 tokens per iteration (which
    cannot hold every sequence's guesses) it stands aside, so a smaller
    share of decode passes verifies a proposal."""
    def run(extra):
        p = subprocess.run([LAMINA, "bench", "serve", "-m", MODEL, "--draft-model", q4, "--draft-cost", "0.2",
                            "--requests", "8",
                            "--fixed", "12:32", "--modes", "continuous", "-t", "1"] + extra,
                           capture_output=True, text=True, timeout=300)
        m = re.search(r"speculation: (\d+) proposed, (\d+) accepted .*; (\d+) of (\d+) decode passes verified",
                      p.stdout)
        ok = p.returncode == 0 and m is not None and " 0 failed" in p.stdout
        share = int(m.group(3)) / max(1, int(m.group(4))) if m else 0
        return ok, m, share, p.stdout + p.stderr
    ok1, m1, s1, out1 = run(["--concurrency", "1"])
    ok8, m8, s8, out8 = run(["--concurrency", "8", "--batch-tokens", "16"])
    result("bench serve --draft-model alone: proposals accepted, acceptance reported",
           ok1 and int(m1.group(1)) > 0 and int(m1.group(2)) > 0, out1[-1500:])
    result("bench serve --draft-model under load: the draft stands aside (share of verifying passes falls)",
           ok8 and s8 < s1 / 2, "alone %.3f, under load %.3f\n%s" % (s1, s8, out8[-1500:]))


def main():
    import tempfile
    servers = []
    tmp = tempfile.TemporaryDirectory()
    try:
        plain = Server()
        servers.append(plain)
        spec = Server("--spec", "ngram", "--draft-max", "6")
        servers.append(spec)
        check_identity(plain, spec)
        check_metrics(plain, spec)
        check_sampled(spec)
        check_errors(spec)
        check_bench_spec()
        q4, bad = make_drafts(tmp.name)
        check_draft_cli(q4, bad)
        check_bench_serve_draft(q4)
        spec.stop("server 1")
        servers.remove(spec)
        drafted = Server("--draft-model", q4, "--draft-max", "5", "--draft-cost", "0.2")
        servers.append(drafted)
        check_identity(plain, drafted)
        check_metrics(plain, drafted)
        check_sampled(drafted)
    except Exception:
        import traceback
        result("e2e_spec ran to the end", False, traceback.format_exc())
    finally:
        for i, s in enumerate(servers):
            s.stop("server %d" % i)
        tmp.cleanup()
    return summary()


if __name__ == "__main__":
    sys.exit(main())
