#!/usr/bin/env python3
"""Speculative decoding on hybrid models (gated-DeltaNet layers with recurrent
state beside full attention): `lamina mkmodel --preset qwen35-small` and
`qwen35moe-small` (F16, random weights) served by `lamina serve` plain and
with `--spec ngram --draft-max 4`, and the dense one with a draft model too
(`--draft-model`: a small llama of the same vocabulary).

Verification runs the pending token and the proposals in one segment, the
recurrent layers saving their state after each token into a checkpoint; after
the verdict the state goes back to the position after the last accepted
token. So, on each model:
  - greedy texts and their tokens' log-probabilities, to the bit, equal the
    plain server's: each prompt alone (repetitive ones, two under a grammar
    that allows only a repeating text, so that the random model's output
    repeats and prompt lookup's guesses get accepted), four at once, four
    repetitive ones at once (--max-seqs 4: 10 checkpoints, fewer than the
    4 x 5 that full proposals of four sequences need, so wishes are cut and
    lamina_spec_ckpt_short_total grows), and beside requests that do not
    speculate ("speculative": false);
  - tokens were proposed and accepted (lamina_spec_accepted_tokens_total > 0)
    and states were rolled back (lamina_spec_state_rollbacks_total > 0);
  - a seed reproduces a sampled, speculated text, which differs from the
    text of another seed;
  - lamina_memory_state_bytes, less the prefix cache's snapshots, is 4 live
    slots plus 10 checkpoints (the plain server's 4 slots x 14 / 4);
  - the server goes idle with no KV block held.
With the draft model the greedy texts equal the plain server's and the draft
proposed tokens. A hybrid draft model is refused.
"""
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
# Random weights do not repeat themselves, so prompt lookup's guesses would all be rejected; a
# grammar that allows only a repeating text makes the greedy output repetitive (the random
# model still picks among the tokens that spell it), so guesses are also accepted.
AB = {"grammar": 'root ::= ("ab")+'}
CAT = {"grammar": 'root ::= ("The cat sat on the mat. ")+'}
PROMPTS = ["ab" * 20, "The cat sat on the mat. The dog sat on the log. " * 4 + "The cat sat",
           "one two three four five six seven eight nine ten " * 5 + "one two three",
           "The cat sat on the mat. " * 3]
EXTRAS = [AB, {}, {}, CAT]
N_GEN = 40
N_LIVE, N_CKPT = 4, 10  # --max-seqs 4; engine_ckpt_slots at --draft-max 4: min(4 x 5, max(2 x 5, 4))


class Server(testenv.Server):
    def __init__(self, model, *args):
        super().__init__([LAMINA, "serve", "-m", model, "-t", "2", "-c", "512", "--kv-type", "F16",
                          "--batch-tokens", "96", "--max-seqs", "4", *args])


def ask(srv, prompt, extra=None):
    """A greedy request's text with its tokens' log-probabilities."""
    body = {"prompt": prompt, "max_tokens": N_GEN, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    body.update(extra or {})
    st, _, data = es.post(srv, C, body, timeout=300)
    if st != 200:
        return "status %d: %r" % (st, data[:300])
    c = json.loads(data)["choices"][0]
    return (c["text"], c["logprobs"]["token_logprobs"] if c.get("logprobs") else None)


def at_once(srv, prompts, extras=None):
    out = [None] * len(prompts)

    def one(i):
        out[i] = ask(srv, prompts[i], extras[i] if extras else None)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def sampled(srv, seed):
    st, _, data = es.post(srv, C, {"prompt": PROMPTS[0], "max_tokens": N_GEN, "temperature": 0.8, "seed": seed,
                                   "ignore_eos": True}, timeout=300)
    return json.loads(data)["choices"][0]["text"] if st == 200 else "status %d" % st


def idle(srv, name):
    ok, m = es.wait_idle(srv, 60)
    result("%s: idle after, no KV block held" % name, ok, m)


def check_model(tmp, preset):
    model = os.path.join(tmp, preset + ".gguf")
    r = subprocess.run([LAMINA, "mkmodel", "--preset", preset, "--type", "F16", "--vocab-from", VOCAB, "-o", model],
                       capture_output=True)
    result("mkmodel %s" % preset, r.returncode == 0, r.stderr.decode()[-400:])
    if r.returncode:
        return None, None
    srv = Server(model)
    try:
        ref = [ask(srv, p, x) for p, x in zip(PROMPTS, EXTRAS)]
        result("%s plain: each prompt gets a text" % preset, all(isinstance(t, tuple) and t[0] for t in ref), ref)
        m = es.metrics(srv)
        live = m.get("lamina_memory_state_bytes", 0) - m.get("lamina_memory_state_snapshot_bytes", 0)
        result("%s plain: the state store holds live slots" % preset, live > 0, live)
    finally:
        srv.stop("%s plain server" % preset)

    srv = Server(model, "--spec", "ngram", "--draft-max", "4", "--spec-widths", "1:1,64:1")
    try:
        m0 = es.metrics(srv)
        own = m0.get("lamina_memory_state_bytes", 0) - m0.get("lamina_memory_state_snapshot_bytes", 0)
        result("%s spec: state bytes (less the snapshots) are %d live slots and %d checkpoints" % (
            preset, N_LIVE, N_CKPT), own * N_LIVE == live * (N_LIVE + N_CKPT),
            "%s, %s without speculation" % (own, live))
        got = [ask(srv, p, x) for p, x in zip(PROMPTS, EXTRAS)]
        for i in range(len(PROMPTS)):
            result("%s spec, prompt %d alone: text and log-probabilities equal the plain server's" % (preset, i),
                   got[i] == ref[i], "%r vs %r" % (got[i], ref[i]))
        m1 = es.metrics(srv)
        acc = m1.get("lamina_spec_accepted_tokens_total", 0)
        prop = m1.get("lamina_spec_proposed_tokens_total", 0)
        rb = m1.get("lamina_spec_state_rollbacks_total", 0)
        result("%s spec alone: tokens proposed and accepted" % preset, 0 < acc <= prop, "%s of %s" % (acc, prop))
        result("%s spec alone: states rolled back" % preset, rb > 0, rb)
        got = at_once(srv, PROMPTS, EXTRAS)
        result("%s spec, four at once: the texts alone" % preset, got == ref, got)
        got = at_once(srv, [PROMPTS[0]] * 4, [AB] * 4)
        result("%s spec, four repetitive at once: the text alone" % preset, got == [ref[0]] * 4, got)
        m2 = es.metrics(srv)
        short = m2.get("lamina_spec_ckpt_short_total", 0)
        result("%s spec, four at once: proposals cut for want of checkpoints" % preset, short > 0, short)
        result("%s spec, four at once: still accepting" % preset,
               m2.get("lamina_spec_accepted_tokens_total", 0) > acc, m2.get("lamina_spec_accepted_tokens_total"))
        got = at_once(srv, PROMPTS, [AB, {"speculative": False}, {}, dict(CAT, speculative=False)])
        result("%s spec, beside requests that do not speculate: the texts alone" % preset, got == ref, got)
        a, b, c = sampled(srv, 5), sampled(srv, 5), sampled(srv, 6)
        result("%s spec: a seed reproduces a sampled text" % preset, a == b and a, "%r vs %r" % (a, b))
        result("%s spec: another seed, another text" % preset, a != c, "%r vs %r" % (a, c))
        idle(srv, "%s spec" % preset)
    finally:
        srv.stop("%s spec server" % preset)
    return model, ref


def main():
    with tempfile.TemporaryDirectory(prefix="lamina_spec_hybrid_") as tmp:
        model, ref = check_model(tmp, "qwen35-small")
        check_model(tmp, "qwen35moe-small")
        if not model:
            return summary()
        draft = os.path.join(tmp, "draft.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "--type", "F16", "--vocab-from", VOCAB, "-o", draft],
                           capture_output=True)
        result("mkmodel: a llama draft of the same vocabulary", r.returncode == 0, r.stderr.decode()[-400:])
        srv = Server(model, "--draft-model", draft, "--draft-max", "4", "--draft-cost", "0.05")
        try:
            got = [ask(srv, p, x) for p, x in zip(PROMPTS, EXTRAS)]
            result("draft model: every text equals the plain server's", got == ref, got)
            m = es.metrics(srv)
            result("draft model: tokens proposed", m.get("lamina_spec_proposed_tokens_total", 0) > 0,
                   m.get("lamina_spec_proposed_tokens_total"))
            got = at_once(srv, PROMPTS, EXTRAS)
            result("draft model, four at once: the texts alone", got == ref, got)
            idle(srv, "draft model")
        finally:
            srv.stop("draft model server")
        r = subprocess.run([LAMINA, "run", "-m", model, "--draft-model", model, "-p", "hi", "-n", "4"],
                           capture_output=True, timeout=120)
        err = r.stderr.decode()
        result("a hybrid draft model is refused", r.returncode != 0 and "draft" in err, err[-300:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
