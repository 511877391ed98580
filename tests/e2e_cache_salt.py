#!/usr/bin/env python3
"""End-to-end checks of the prefix cache's tenant isolation in `lamina serve`
(models/stories260K.gguf).

A server with two API keys (--api-key twice). Every request sends the same
long prompt (several KV blocks) with max_tokens 2, one at a time, and the
checks read both the answer's usage.prompt_tokens_details.cached_tokens and
the change of lamina_prefix_cache_hits_total in /metrics:

  - the first request under key A finds nothing cached; the same prompt
    again under A is served from the cache (cached_tokens > 0, hits grow);
  - the same prompt under key B finds nothing (cached_tokens 0, no hit),
    and hits under B once B has run it;
  - a cache_salt under one key separates requests: A with cache_salt "x"
    finds nothing, then hits on the second try; B with the same "x" finds
    nothing (a key's salt and a cache_salt together name the namespace);
  - the outputs of greedy requests are the same whatever the namespace;
  - bad cache_salt values (a number, an object, "", 257 bytes) are 400 with
    param "cache_salt"; 256 bytes and null are accepted.
A server without keys: cache_salt alone separates requests there too.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_server as es  # noqa: E402 (its Server, post, metrics, wait_idle, expect_error)
from testenv import result, summary  # noqa: E402

C = "/v1/completions"
PROMPT = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
          "One day she saw a big red ball under a tree and ran to get it. ") * 2


def hits(srv):
    return es.metrics(srv).get("lamina_prefix_cache_hits_total", 0)


def ask(srv, key, salt=None, unset=False):
    """(cached_tokens, hit-counter growth, text) of one greedy request."""
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    if salt is not None or unset:
        body["cache_salt"] = salt
    h0 = hits(srv)
    st, _, data = es.post(srv, C, body, {"Authorization": "Bearer " + key} if key else None)
    if st != 200:
        raise RuntimeError("status %d: %r" % (st, data[:300]))
    j = json.loads(data)
    ok, _ = es.wait_idle(srv)
    if not ok:
        raise RuntimeError("server did not become idle")
    return j["usage"]["prompt_tokens_details"]["cached_tokens"], hits(srv) - h0, j["choices"][0]["text"]


def check_keys():
    srv = es.Server("--api-key", "tenant-a", "--api-key", "tenant-b")
    try:
        auth_b = {"Authorization": "Bearer tenant-b"}
        st, _, _ = es.post(srv, C, {"prompt": "a", "max_tokens": 1}, auth_b)
        result("second --api-key accepted", st == 200, st)
        st, _, _ = es.post(srv, C, {"prompt": "a", "max_tokens": 1}, {"Authorization": "Bearer tenant-c"})
        result("a key not given refused", st == 401, st)

        a1 = ask(srv, "tenant-a")
        result("key A, first time: nothing cached", a1[0] == 0 and a1[1] == 0, a1)
        a2 = ask(srv, "tenant-a")
        result("key A, again: served from the cache", a2[0] > 0 and a2[1] > 0, a2)
        b1 = ask(srv, "tenant-b")
        result("key B, same prompt: shares nothing with A", b1[0] == 0 and b1[1] == 0, b1)
        b2 = ask(srv, "tenant-b")
        result("key B, again: hits its own cache", b2[0] > 0 and b2[1] > 0, b2)
        ax1 = ask(srv, "tenant-a", "x")
        result("key A with cache_salt: shares nothing with A's own cache", ax1[0] == 0 and ax1[1] == 0, ax1)
        ax2 = ask(srv, "tenant-a", "x")
        result("key A with the same cache_salt again: hits", ax2[0] > 0 and ax2[1] > 0, ax2)
        bx1 = ask(srv, "tenant-b", "x")
        result("key B with A's cache_salt: shares nothing", bx1[0] == 0 and bx1[1] == 0, bx1)
        ay = ask(srv, "tenant-a", "y")
        result("key A with another cache_salt: shares nothing", ay[0] == 0 and ay[1] == 0, ay)
        an = ask(srv, "tenant-a", None, unset=True)
        result("cache_salt null is the key's own cache", an[0] > 0 and an[1] > 0, an)
        texts = {r[2] for r in (a1, a2, b1, b2, ax1, ax2, bx1, ay, an)}
        result("greedy output the same in every namespace", len(texts) == 1, texts)

        auth_a = {"Authorization": "Bearer tenant-a"}
        for name, v in (("a number", 5), ("an object", {"a": 1}), ("empty", ""), ("257 bytes", "s" * 257),
                        ("a list", ["x"])):
            es.expect_error(srv, "cache_salt " + name + " refused", C, {"prompt": "a", "max_tokens": 1,
                                                                        "cache_salt": v}, 400, "cache_salt",
                            headers=auth_a)
        st, _, data = es.post(srv, C, {"prompt": "a", "max_tokens": 1, "cache_salt": "s" * 256}, auth_a)
        result("cache_salt of 256 bytes accepted", st == 200, data[:200])
        st, _, data = es.post(srv, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "cache_salt": 7},
                              auth_a)
        result("cache_salt checked on chat too", st == 400 and json.loads(data)["error"]["param"] == "cache_salt",
                  data[:200])
    finally:
        srv.stop("two-key server")


def check_open():
    srv = es.Server()
    try:
        n1 = ask(srv, None)
        n2 = ask(srv, None)
        result("no keys: the same prompt hits", n1[0] == 0 and n2[0] > 0 and n2[1] > 0, (n1, n2))
        s1 = ask(srv, None, "tenant-1")
        s2 = ask(srv, None, "tenant-1")
        result("no keys: cache_salt separates, then hits", s1[0] == 0 and s1[1] == 0 and s2[0] > 0, (s1, s2))
    finally:
        srv.stop("open server")


def main():
    if not os.path.exists(es.LAMINA):
        print("FAIL no lamina binary at %s" % es.LAMINA)
        print("0 passed, 1 failed")
        return 1
    try:
        check_keys()
        check_open()
    except Exception:
        import traceback
        result("e2e_cache_salt ran to the end", False, traceback.format_exc())
    return summary()


if __name__ == "__main__":
    sys.exit(main())
