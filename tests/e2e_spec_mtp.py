#!/usr/bin/env python3
"""Speculative decoding by the model's own next-token-prediction layer
(`--spec mtp`): `lamina mkmodel --preset qwen35-small --mtp 1` and
`qwen35moe-small --mtp 1` (F16, random weights) served plain and with
`--spec mtp --draft-max 3` (the pass priced flat, `--spec-widths 1:1,64:1`,
so that the policy keeps proposing although the random head's guesses are
rejected). On each model:
  - greedy texts and their tokens' log-probabilities, to the bit, equal the
    plain server's: each prompt alone (e2e_spec_hybrid.py's prompts, two
    under a grammar), and four at once (four MTP slots in use);
  - tokens were proposed (lamina_spec_proposed_tokens_total > 0);
  - a seed reproduces a sampled, speculated text;
  - the server goes idle with no KV block held.
A file without the layer is refused by name (`lamina run --spec mtp`).
Acceptance is not checked: an untrained head agrees with the random trunk
about once in 50,000 tokens (bench/results/speculative.md).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402
import e2e_spec_hybrid as sh  # noqa: E402 (its server, requests and prompts)
from testenv import result, summary  # noqa: E402

LAMINA = sh.LAMINA


def check_model(tmp, preset):
    model = os.path.join(tmp, preset + "-mtp.gguf")
    r = subprocess.run([LAMINA, "mkmodel", "--preset", preset, "--type", "F16", "--mtp", "1", "--vocab-from",
                        sh.VOCAB, "-o", model], capture_output=True)
    result("mkmodel %s --mtp 1" % preset, r.returncode == 0, r.stderr.decode()[-400:])
    if r.returncode:
        return
    srv = sh.Server(model)
    try:
        ref = [sh.ask(srv, p, x) for p, x in zip(sh.PROMPTS, sh.EXTRAS)]
        result("%s plain: each prompt gets a text" % preset, all(isinstance(t, tuple) and t[0] for t in ref), ref)
    finally:
        srv.stop("%s plain server" % preset)
    srv = sh.Server(model, "--spec", "mtp", "--draft-max", "3", "--spec-widths", "1:1,64:1")
    try:
        got = [sh.ask(srv, p, x) for p, x in zip(sh.PROMPTS, sh.EXTRAS)]
        for i in range(len(sh.PROMPTS)):
            result("%s mtp, prompt %d alone: text and log-probabilities equal the plain server's" % (preset, i),
                   got[i] == ref[i], "%r vs %r" % (got[i], ref[i]))
        m = es.metrics(srv)
        prop = m.get("lamina_spec_proposed_tokens_total", 0)
        result("%s mtp: tokens proposed" % preset, prop > 0, prop)
        got = sh.at_once(srv, sh.PROMPTS, sh.EXTRAS)
        result("%s mtp, four at once: the texts alone" % preset, got == ref, got)
        m2 = es.metrics(srv)
        result("%s mtp, four at once: still proposing" % preset,
               m2.get("lamina_spec_proposed_tokens_total", 0) > prop, m2.get("lamina_spec_proposed_tokens_total"))
        a, b = sh.sampled(srv, 5), sh.sampled(srv, 5)
        result("%s mtp: a seed reproduces a sampled text" % preset, a == b and a, "%r vs %r" % (a, b))
        sh.idle(srv, "%s mtp" % preset)
    finally:
        srv.stop("%s mtp server" % preset)


def main():
    with tempfile.TemporaryDirectory(prefix="lamina_spec_mtp_") as tmp:
        check_model(tmp, "qwen35-small")
        check_model(tmp, "qwen35moe-small")
        plain = os.path.join(tmp, "plain.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "--preset", "qwen35-small", "--type", "F16", "--vocab-from", sh.VOCAB,
                            "-o", plain], capture_output=True)
        r = subprocess.run([LAMINA, "run", "-m", plain, "--spec", "mtp", "-p", "hi", "-n", "4"], capture_output=True,
                           timeout=120)
        err = r.stderr.decode()
        result("--spec mtp on a file without the layer is refused by name",
               r.returncode != 0 and "needs a model with an MTP layer" in err, err[-300:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
