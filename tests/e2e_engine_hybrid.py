#!/usr/bin/env python3
"""The engine on a hybrid model (gated-DeltaNet layers with recurrent state
beside full attention): `lamina mkmodel --preset qwen35-small --type F16`
served by `lamina serve`, greedy requests of prompts longer than one chunk
of the delta rule (64 positions) so that prompts are split into several
segments (--batch-tokens 96).

Every greedy text, and its tokens' log-probabilities to the bit, must be the
one the request gets alone:
  - alone through the server, and by `lamina run` (one segment per prompt);
  - several requests at once (the prompts split by the scheduler beside
    each other's decodes);
  - n = 2 choices (the fork copies the prompt's state), both choices;
  - --max-seqs 1 with several requests (each waits for the previous);
  - a KV pool too small for all at once (--kv-mem), so that some are
    preempted and recomputed (lamina_preemptions_total grows), 48 tokens
    each, against the same requests one at a time;
  - beside a streamed request cancelled mid-way (its state slot given
    back: the server goes idle and serves the same text again);
and /metrics reports the state's bytes (lamina_memory_state_bytes: one slot
per --max-seqs and as many snapshot slots, lamina_memory_state_snapshot_bytes).

The prefix cache (on in these servers: the checks above also run from its
snapshots): requests that share a long system prompt, greedy and sampled
with a seed, one after another, get the texts a server with
--state-snapshots 0 gives them (its KV hits are all cut to nothing, so it
prefills every prompt from position 0, as with the cache off), while their
usage says most of the prompt was cached from the third request on (the
second saves the state where the shared prompt ends), and the snapshot
and prefix-hit counters of /metrics move; the same prompt again skips all
but its last positions. Then `--preset qwen3next-small` (Qwen3-Next: value
heads grouped by key head, a fused ssm_ba, experts) with --max-seqs 4: each
text alone equals lamina run's, three at once and n = 2 equal the texts
alone, and its state's bytes. Under AddressSanitizer (LAMINA_ASAN) the same
checks run.
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402 (its post, metrics, wait_idle)
import testenv  # noqa: E402
from testenv import result, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vocab", "ggml-vocab-gpt-2.gguf")
C = "/v1/completions"
BASE = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
        "One day she saw a big red ball under a tree and ran to get it. ")
PROMPTS = [BASE * 2, "The capital of France is Paris. " * 9 + BASE, "def fibonacci(n):\n    return n\n" * 12]
N_GEN = 24
# one state slot of qwen35-small: 6 layers x (3 x 512 conv + 4 x 64 x 64 matrix) floats
SLOT_BYTES = 6 * (3 * 512 + 4 * 64 * 64) * 4
SYSTEM = ("You are a helpful assistant for a small town library. You answer questions about opening hours, "
          "books, events and the rules of the reading room. Be brief and friendly. ") * 4
QUESTIONS = ["Q: When does the library open on Sundays?\nA:", "Q: Can I bring my dog inside?\nA:",
             "Q: How many books may I borrow at once?\nA:", "Q: Is there a reading group for children?\nA:"]
# and of qwen3next-small: 6 layers x (3 x 1024 conv + 4 x 128 x 128 matrix) floats
SLOT_BYTES_NEXT = 6 * (3 * 1024 + 4 * 128 * 128) * 4


class Server(testenv.Server):
    def __init__(self, model, *args):
        super().__init__([LAMINA, "serve", "-m", model, "-t", "2", "-c", "512", "--kv-type", "F16",
                          "--batch-tokens", "96", *args])


def ask(srv, prompt, n=1, n_gen=N_GEN, usage=None, seed=None):
    """The texts of a greedy request's choices (sampled with a seed), each with its tokens'
    log-probabilities (the same bits, or the forward pass saw the sequence grouped otherwise);
    the answer's usage into the dict usage."""
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "n": n, "ignore_eos": True, "logprobs": 1}
    if seed is not None:
        body.update({"temperature": 0.9, "top_p": 1, "seed": seed})
    st, _, data = es.post(srv, C, body, timeout=300)
    if st != 200:
        return ["status %d: %r" % (st, data[:300])]
    d = json.loads(data)
    if usage is not None:
        usage.update(d.get("usage", {}))
    return [(c["text"], c["logprobs"]["token_logprobs"]) for c in sorted(d["choices"], key=lambda c: c["index"])]


def shared_prompt(srv, seed=None):
    """The questions after the system prompt, one after another: their texts and the tokens
    each one's usage says were cached."""
    out, cached = [], []
    for q in QUESTIONS:
        u = {}
        out.append(ask(srv, SYSTEM + q, usage=u, seed=seed)[0])
        cached.append((u.get("prompt_tokens_details") or {}).get("cached_tokens", -1))
    return out, cached, u.get("prompt_tokens", 0)


def at_once(srv, prompts, n_gen=N_GEN):
    out = [None] * len(prompts)

    def one(i):
        out[i] = ask(srv, prompts[i], n_gen=n_gen)[0]

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def idle(srv, name):
    ok, m = es.wait_idle(srv, 60)
    result("%s: idle after, no KV block held" % name, ok, m)
    return m


def run_alone(model, prompt):
    r = subprocess.run([LAMINA, "run", "-m", model, "-p", prompt, "-n", str(N_GEN), "--temp", "0", "--kv-type",
                        "F16", "-c", "512", "--ignore-eos", "-t", "2"], capture_output=True, timeout=300)
    out = r.stdout.decode("utf-8", "replace")
    return out[len(prompt):].rstrip("\n") if r.returncode == 0 and out.startswith(prompt) else None


def cancel_one(srv, prompt):
    """Stream a request and close the connection after its first tokens."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", C, body=json.dumps({"prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True,
                                          "ignore_eos": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    for _ in range(4):
        r.readline()
    c.close()


def check_next(tmp):
    """qwen3next-small through the server: alone, with lamina run, at once, n = 2."""
    model = os.path.join(tmp, "qwen3next.gguf")
    r = subprocess.run([LAMINA, "mkmodel", "--preset", "qwen3next-small", "--type", "F16", "--vocab-from", VOCAB,
                        "-o", model], capture_output=True)
    if not result("mkmodel qwen3next-small", r.returncode == 0, r.stderr.decode()[-400:]):
        return
    srv = Server(model, "--max-seqs", "4")
    try:
        alone = [ask(srv, p)[0] for p in PROMPTS]
        result("qwen3next alone: each prompt gets a text", all(len(t[0]) > 0 for t in alone), alone)
        for i, p in enumerate(PROMPTS):
            ref = run_alone(model, p)
            result("qwen3next prompt %d: the server's text alone is lamina run's" % i, ref == alone[i][0],
                   "%r vs %r" % (ref, alone[i][0]))
        m = es.metrics(srv)
        result("qwen3next /metrics: lamina_memory_state_bytes is 4 live and 4 snapshot slots",
               m.get("lamina_memory_state_bytes") == 8 * SLOT_BYTES_NEXT and
               m.get("lamina_memory_state_snapshot_bytes") == 4 * SLOT_BYTES_NEXT,
               (m.get("lamina_memory_state_bytes"), m.get("lamina_memory_state_snapshot_bytes")))
        got = at_once(srv, PROMPTS)
        result("qwen3next three requests at once: the texts alone", got == alone, got)
        two = ask(srv, PROMPTS[0], n=2)
        result("qwen3next n = 2: both choices the text alone", two == [alone[0], alone[0]], two)
        idle(srv, "qwen3next")
    finally:
        srv.stop("qwen3next server")


def main():
    with tempfile.TemporaryDirectory(prefix="lamina_hybrid_") as tmp:
        model = os.path.join(tmp, "qwen35.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "--preset", "qwen35-small", "--type", "F16", "--vocab-from", VOCAB,
                            "-o", model], capture_output=True)
        result("mkmodel qwen35-small", r.returncode == 0, r.stderr.decode()[-400:])
        if r.returncode:
            return summary()

        srv = Server(model, "--max-seqs", "4")
        try:
            alone = [ask(srv, p)[0] for p in PROMPTS]
            result("alone: each prompt gets a text", all(len(t[0]) > 0 for t in alone), alone)
            for i, p in enumerate(PROMPTS):
                ref = run_alone(model, p)
                result("prompt %d: the server's text alone is lamina run's" % i, ref == alone[i][0],
                       "%r vs %r" % (ref, alone[i][0]))
            m = es.metrics(srv)
            result("/metrics: lamina_memory_state_bytes is 4 live and 4 snapshot slots",
                   m.get("lamina_memory_state_bytes") == 8 * SLOT_BYTES and
                   m.get("lamina_memory_state_snapshot_bytes") == 4 * SLOT_BYTES,
                   (m.get("lamina_memory_state_bytes"), m.get("lamina_memory_state_snapshot_bytes")))
            got = at_once(srv, PROMPTS)
            result("three requests at once: the texts alone", got == alone, got)
            got = at_once(srv, PROMPTS + PROMPTS[:1])
            result("four requests at once: the texts alone", got == alone + alone[:1], got)
            two = ask(srv, PROMPTS[0], n=2)
            result("n = 2: both choices the text alone", two == [alone[0], alone[0]], two)
            idle(srv, "max-seqs 4")
            t = threading.Thread(target=cancel_one, args=(srv, PROMPTS[2]))
            t.start()
            got = ask(srv, PROMPTS[1])[0]
            t.join()
            result("beside a cancelled request: the text alone", got == alone[1], got)
            idle(srv, "after a cancellation")
            got = at_once(srv, PROMPTS)
            result("after the cancellation, three at once: the texts alone", got == alone, got)
            idle(srv, "max-seqs 4, the end")
        finally:
            srv.stop("max-seqs 4 server")

        # the prefix cache's reference: no snapshot slot, so every KV hit is cut to nothing
        srv = Server(model, "--max-seqs", "4", "--state-snapshots", "0")
        try:
            ref = [shared_prompt(srv, seed) for seed in (None, 7)]
            result("--state-snapshots 0: nothing cached", all(c == [0] * len(QUESTIONS) for _, c, _ in ref),
                   [c for _, c, _ in ref])
            m = es.metrics(srv)
            result("--state-snapshots 0: no snapshot memory, no prefix hit",
                   m.get("lamina_memory_state_snapshot_bytes") == 0 and m.get("lamina_prefix_cache_hits_total") == 0,
                   m)
        finally:
            srv.stop("no-snapshot server")

        srv = Server(model, "--max-seqs", "4", "--state-snapshots", "8")
        try:
            for i, seed in enumerate((None, 7)):
                m0 = es.metrics(srv)
                got, cached, n_prompt = shared_prompt(srv, seed)
                m1 = es.metrics(srv)
                name = "seed %d" % seed if seed is not None else "greedy"
                result("shared system prompt, %s: the texts without snapshots" % name, got == ref[i][0],
                       (got, ref[i][0]))
                # the first request of the greedy run prefills all; the sampled run (the same
                # prompts) finds every prompt's own snapshot
                result("shared system prompt, %s: mostly cached from the %s request on" % (name, "third" if i == 0
                                                                                         else "first"),
                       all(c > n_prompt // 2 for c in cached[2 if i == 0 else 0:]) and
                       (i or cached[0] == 0), (cached, n_prompt))
                hits = m1.get("lamina_prefix_cache_hits_total", 0) - m0.get("lamina_prefix_cache_hits_total", 0)
                result("shared system prompt, %s: prefix hits are the cached tokens' blocks" % name,
                       hits * 16 == sum(cached), (hits, cached))
                for k in ("saved", "restored"):
                    key = "lamina_state_snapshots_%s_total" % k
                    result("shared system prompt, %s: %s grows" % (name, key),
                           m1.get(key, 0) > m0.get(key, 0) or (k == "saved" and i == 1), (m0.get(key), m1.get(key)))
            u = {}
            again = ask(srv, SYSTEM + QUESTIONS[0], usage=u)[0]
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", -1)
            result("the same prompt again: all but its last positions cached, the same text",
                   again == ref[0][0][0] and u.get("prompt_tokens", 0) - 80 < cached < u.get("prompt_tokens", 0),
                   (cached, u.get("prompt_tokens")))
            idle(srv, "prefix cache")
        finally:
            srv.stop("prefix cache server")

        srv = Server(model, "--max-seqs", "1")
        try:
            got = at_once(srv, PROMPTS)
            result("--max-seqs 1, three requests: the texts alone", got == alone, got)
            idle(srv, "max-seqs 1")
        finally:
            srv.stop("max-seqs 1 server")

        # 2048 bytes of KV per position: 14 blocks of 16 hold two of the prompts of 81 and 104
        # positions, but not their growth by 48 tokens each (three different prompts: the
        # prefix cache, which restores each one's own snapshot, shares no block between them)
        srv = Server(model, "--max-seqs", "4", "--kv-mem", str(14 * 16 * 2048))
        try:
            few = PROMPTS
            ref = [ask(srv, p, n_gen=48)[0] for p in few]
            p0 = es.metrics(srv).get("lamina_preemptions_total", 0)
            # one request of the three prompts: submitted together, so they run together (three
            # requests from threads could each end before the next arrived on a loaded machine)
            got = ask(srv, few, n_gen=48)
            p1 = es.metrics(srv).get("lamina_preemptions_total", 0)
            result("a small KV pool, three requests: the texts alone", got == ref, got)
            result("a small KV pool: requests were preempted", p1 > p0, "%s -> %s" % (p0, p1))
            idle(srv, "small KV pool")
        finally:
            srv.stop("small KV pool server")
        os.unlink(model)
        check_next(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
