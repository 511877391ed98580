#!/usr/bin/env python3
"""hybrid_spec_tps.py - decode speed and acceptance of prompt lookup on a hybrid model (recurrent
state beside attention, rolled back by checkpoints after a rejected guess), speculation off and
on.

Not part of `make test` (tests/e2e_spec_hybrid.py and tests/test_engine_hybrid.c check the
outputs). Writes `lamina mkmodel --preset qwen35-small` (F16, the GPT-2 vocabulary; --preset for
another) and serves it with `--spec ngram --draft-max 4` (--widths: a set width curve, default
flat, so that the price of a wider pass measured on a loaded machine does not decide). Random
weights never repeat themselves, so each request carries a grammar that allows only a repeating
text: the output repeats (the model still picks among the tokens that spell it) and prompt
lookup's guesses are accepted, or rejected where the model spells the text otherwise. For each
grammar, --reps times: the same greedy request of --n tokens with "speculative": false, then
true. Prints the decode speed (1 / the request's time per output token, from /metrics) and the
proposed, accepted and rolled-back counts of each.

    python3 bench/hybrid_spec_tps.py
    python3 bench/hybrid_spec_tps.py --preset qwen35moe-small --widths ""
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import e2e_server as es  # noqa: E402
import testenv  # noqa: E402

GRAMMARS = [("ab", 'root ::= ("ab")+'), ("cat", 'root ::= ("The cat sat on the mat. ")+')]
K = ["lamina_spec_proposed_tokens_total", "lamina_spec_accepted_tokens_total", "lamina_spec_state_rollbacks_total",
     "lamina_time_per_output_token_seconds_sum", "lamina_time_per_output_token_seconds_count"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lamina", default=os.environ.get("LAMINA_BIN", "build/lamina"))
    ap.add_argument("--preset", default="qwen35-small")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("--widths", default="1:1,64:1")
    a = ap.parse_args()
    vocab = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "vocab",
                         "ggml-vocab-gpt-2.gguf")
    with tempfile.TemporaryDirectory(prefix="lamina_spec_tps_") as tmp:
        model = os.path.join(tmp, "m.gguf")
        subprocess.run([a.lamina, "mkmodel", "--preset", a.preset, "--type", "F16", "--vocab-from", vocab, "-o", model],
                       check=True, capture_output=True)
        args = [a.lamina, "serve", "-m", model, "-t", a.threads, "-c", "1024", "--kv-type", "F16", "--max-seqs", "4",
                "--spec", "ngram", "--draft-max", "4"] + (["--spec-widths", a.widths] if a.widths else [])
        srv = testenv.Server(args)
        try:
            print("| grammar | speculation | decode tok/s (median) | proposed | accepted | rollbacks |")
            print("| --- | --- | ---: | ---: | ---: | ---: |")
            for name, g in GRAMMARS:
                rows = {False: [], True: []}
                for _ in range(a.reps):
                    for on in (False, True):
                        es.wait_idle(srv, 60)  # the last iteration's counters published
                        m0 = es.metrics(srv)
                        st, _, data = es.post(srv, "/v1/completions", {
                            "prompt": "The cat sat on the mat. " * 2, "max_tokens": a.n, "temperature": 0,
                            "ignore_eos": True, "grammar": g, "speculative": on}, timeout=600)
                        if st != 200:
                            sys.exit("request failed: %d %r" % (st, data[:200]))
                        es.wait_idle(srv, 60)
                        m1 = es.metrics(srv)
                        rows[on].append([m1.get(k, 0) - m0.get(k, 0) for k in K])
                for on in (False, True):
                    r = rows[on]
                    tps = statistics.median(x[4] / x[3] for x in r if x[3])
                    print("| %s | %s | %.1f | %d | %d | %d |" % (name, "on" if on else "off", tps, r[-1][0], r[-1][1],
                                                                 r[-1][2]))
        finally:
            srv.stop("server")


if __name__ == "__main__":
    main()
