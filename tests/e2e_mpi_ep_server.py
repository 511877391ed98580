#!/usr/bin/env python3
"""`lamina serve` under expert parallelism: mpirun --oversubscribe -np 2
$BUILD/mpi/lamina serve ... --ep 2 on mkmodel's qwen2moe-small (F16: 8
experts of which each rank holds 4, top 4, and a shared expert), against a
single-process `lamina serve` of the default build with the same flags,
through plain HTTP:

  - three greedy completions of 32 tokens at once (one batch of several
    sequences whose rows are split between the ranks as homes, their block
    tables in each plan): the single process's texts and token
    log-probabilities to the bit (each row's expert results are summed at
    its home in the single process's order, model/ep.h);
  - SIGTERM to mpirun: the whole job ends, no rank reports an error;
  - the same on 4 ranks with --ep 2 --tp 2 (attention and the shared
    expert split by --tp inside each expert rank's pair): the single
    process's texts, and log-probabilities within 1e-3 of its (tensor
    parallelism's sums round differently; measured 7.7e-5).
Skipped, saying why, when the MPI binary or mpirun is absent.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402 (post)
import testenv  # noqa: E402
from testenv import result, skip, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
LAMINA_MPI = os.path.join(os.path.dirname(LAMINA), "mpi", "lamina")
os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                  OMPI_MCA_rmaps_base_oversubscribe="1",
                  ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":"))
VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vocab", "ggml-vocab-llama-spm.gguf")
PROMPTS = ["Once upon a time there was a little girl named Lily.", "The capital of France is",
           "def fibonacci(n):\n    return"]
N_CHECKS = 8


def ask(srv, prompt):
    body = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    st, _, data = es.post(srv, "/v1/completions", body, timeout=300)
    if st != 200:
        return ("status %d: %r" % (st, data[:300]), None)
    c = json.loads(data)["choices"][0]
    return (c["text"], c["logprobs"]["token_logprobs"])


def together(srv):
    got = [None] * len(PROMPTS)

    def one(i):
        got[i] = ask(srv, PROMPTS[i])

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return got


def main():
    if not os.access(LAMINA_MPI, os.X_OK) or not shutil.which("mpirun"):
        skip("mpi serve --ep", "no %s or no mpirun (make mpi; scripts/deps.sh installs Open MPI)" % LAMINA_MPI,
             N_CHECKS)
        return summary()
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "qwen2moe.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "--preset", "qwen2moe-small", "--type", "F16", "--vocab-from", VOCAB,
                            "-o", model, "-t", "1"], capture_output=True)
        result("mkmodel qwen2moe-small", r.returncode == 0, r.stderr.decode()[-400:])
        if r.returncode:
            return summary()
        flags = ["-m", model, "-t", "1", "-c", "256", "--max-seqs", "4"]
        one = testenv.Server([LAMINA, "serve", *flags])
        try:
            ref = together(one)
        finally:
            one.stop("single process")
        try:
            srv = testenv.Server(["mpirun", "--oversubscribe", "-np", "2", LAMINA_MPI, "serve", *flags, "--ep", "2"],
                                 start_timeout=180)
        except RuntimeError as e:
            result("--ep 2: server starts", False, str(e)[-2000:])
            return summary()
        try:
            got = together(srv)
            result("--ep 2: three greedy requests at once, the single process's texts",
                   [g[0] for g in got] == [x[0] for x in ref] and all(x[1] for x in ref), (got, ref))
            result("--ep 2: their log-probabilities to the bit", [g[1] for g in got] == [x[1] for x in ref],
                   (got, ref))
        finally:
            ended = testenv.terminate(srv, "--ep 2")
            if ended:
                result("--ep 2: the job ends on SIGTERM, no rank reports an error",
                       not re.search(r"rank \d+:|Sanitizer|runtime error:", ended[1]), ended[1][-3000:])
        try:
            srv = testenv.Server(["mpirun", "--oversubscribe", "-np", "4", LAMINA_MPI, "serve", *flags, "--ep", "2",
                                  "--tp", "2"], start_timeout=180)
        except RuntimeError as e:
            result("--ep 2 --tp 2: server starts", False, str(e)[-2000:])
            return summary()
        try:
            got = together(srv)
            result("--ep 2 --tp 2: three greedy requests at once, the single process's texts",
                   [g[0] for g in got] == [x[0] for x in ref] and all(x[1] for x in ref), (got, ref))
            diff = max((abs(a - b) for g, x in zip(got, ref) if g[1] and x[1] and len(g[1]) == len(x[1])
                        for a, b in zip(g[1], x[1])), default=None)
            result("--ep 2 --tp 2: their log-probabilities within 1e-3 (max difference %s)" % diff,
                   diff is not None and diff <= 1e-3 and all(g[1] and len(g[1]) == 32 for g in got), (got, ref))
        finally:
            ended = testenv.terminate(srv, "--ep 2 --tp 2")
            if ended:
                result("--ep 2 --tp 2: the job ends on SIGTERM, no rank reports an error",
                       not re.search(r"rank \d+:|Sanitizer|runtime error:", ended[1]), ended[1][-3000:])
    return summary()


if __name__ == "__main__":
    sys.exit(main())
