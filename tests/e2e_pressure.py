#!/usr/bin/env python3
"""`lamina serve` under memory pressure: a KV pool of a few blocks, 64 clients.

The bundled model (models/stories260K.gguf: a 128-token context, 10 KiB per
16-token F16 block) is served with --kv-mem 100K: a pool of 10 blocks, where
one request may need up to 8 and 64 sequences may run at once. 64 client
threads send a seeded mix of requests:
  - /v1/completions with a short text prompt (or two in one request) or a
    token-id prompt of 40..110 tokens, and /v1/chat/completions (ChatML);
  - max_tokens short (1..8) or long (up to the rest of the context);
  - n = 1, or 2 or 3 for some; greedy or sampled with a seed;
  - streaming or not;
  - some cancelled mid-way: a stream closed after a few events, or a
    non-streaming request whose client closes the connection before the
    answer.
The same requests, none cancelled, first run against a roomy server (the
default pool), which gives each one's expected text.

Every request must end in one of the intended ways, each counted:
  - complete: 200 with every choice finished ("stop" or "length") and the
    roomy server's text (preemption recomputes the same output);
  - refused: 400 context_length_exceeded naming the KV blocks, exactly for
    the requests the pool could never hold (the engine's rule: the prompt
    once, each further choice's generated tokens and a copied block; with
    two prompts, a first one already submitted is cancelled);
  - cancelled by its client: what it had received is a prefix of the
    expected text.
Anything else (another status, a malformed or truncated stream, a wrong
text, no answer within the deadline) is a failure. Afterwards /metrics must
show preemptions, nothing running or waiting, every accepted request
finished, and every KV block free (lamina_kv_blocks_free ==
lamina_kv_blocks_total); the server still answers /health and exits 0 on
SIGTERM without a sanitizer report.

Then the same load on the same pool with --max-waiting 16, where most
requests find the queue full: 429 server_busy with Retry-After is one more
intended outcome (also for the second prompt of a request whose first was
accepted, which is then cancelled), and the same checks hold afterwards but
preemption (likely, not certain, with most requests turned away).
"""
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import result, summary  # noqa: E402

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
ASAN = bool(os.environ.get("LAMINA_ASAN"))
CTX = 128                # the model's trained context: the server's default
BLOCK = 16               # positions per KV block
BLOCK_BYTES = 10240      # 16 positions x 5 layers x 4 KV heads x 8 dims x K and V x 2 bytes (F16)
POOL_BLOCKS = 10
CLIENTS = 64
TOTAL = 128 if ASAN else 512
DEADLINE = 300           # seconds for the whole load; past it a request counts as hung

lock = threading.Lock()  # for what the clients' threads share


class Server(testenv.Server):
    def __init__(self, *args):
        super().__init__([LAMINA, "serve", "-m", MODEL, "-t", "1", "--chat-template", "chatml", *args])

    def wait_idle(self, timeout=60):
        deadline = time.time() + timeout
        m = {}
        while time.time() < deadline:
            m = self.metrics()
            if m.get("lamina_requests_running") == 0 and m.get("lamina_requests_waiting") == 0 and \
                    m.get("lamina_kv_blocks_used") == 0:
                return True, m
            time.sleep(0.05)
        return False, m


# ------------------------------------------------------------ the requests

TEXTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park"]
CHATS = [[{"role": "user", "content": "Tell me a story."}], [{"role": "user", "content": "Hi"}]]


def make_requests():
    rng = random.Random(1515)
    reqs = []
    for i in range(TOTAL):
        chat = rng.random() < 0.25
        body = {"max_tokens": 0, "seed": rng.randrange(1 << 31),
                "temperature": 0.0 if rng.random() < 0.5 else 0.9, "ignore_eos": rng.random() < 0.5}
        if chat:
            body["messages"] = rng.choice(CHATS)
        elif rng.random() < 0.5:
            # one text, or two in one request (each its own engine request; choice index = prompt x n + i)
            body["prompt"] = rng.choice(TEXTS) if rng.random() < 0.8 else [rng.choice(TEXTS), rng.choice(TEXTS)]
        else:
            n = rng.randint(40, 110)
            body["prompt"] = [1] + [rng.randint(3, 511) for _ in range(n - 1)]
        if rng.random() < 0.25:
            body["n"] = rng.randint(2, 3)
        r = {"i": i, "chat": chat, "body": body, "long": rng.random() < 0.5, "stream": rng.random() < 0.5,
             "u": rng.random(), "cancel": None}
        if rng.random() < 0.2:
            r["cancel"] = rng.randint(1, 6) if r["stream"] else rng.uniform(0.005, 0.2)
        reqs.append(r)
    return reqs


def prompts_of(r):
    """The request's prompts: a list of token-id lists, texts or message lists."""
    b = r["body"]
    if r["chat"]:
        return [b["messages"]]
    p = b["prompt"]
    return p if isinstance(p, list) and p and isinstance(p[0], str) else [p]


def n_choices(r):
    return len(prompts_of(r)) * r["body"].get("n", 1)


def prompt_tokens(srv, reqs):
    """Each prompt's length as the server counts it (usage.prompt_tokens of a
    one-token request; token-id prompts are their own length)."""
    seen = {}
    for r in reqs:
        r["n_prompts"] = []
        for p in prompts_of(r):
            if isinstance(p, list) and p and isinstance(p[0], int):
                r["n_prompts"].append(len(p))
                continue
            key = json.dumps(p)
            if key not in seen:
                probe = {"messages" if r["chat"] else "prompt": p, "max_tokens": 1}
                st, data = post(srv, "/v1/chat/completions" if r["chat"] else "/v1/completions", probe)
                if st != 200:
                    raise RuntimeError("prompt length probe: status %d: %r" % (st, data[:300]))
                seen[key] = json.loads(data)["usage"]["prompt_tokens"]
            r["n_prompts"].append(seen[key])


def finish_requests(reqs):
    """max_tokens from the longest prompt, and which prompt the pool could
    never hold (the engine's rule for submission; prompts are submitted in
    order, and the first that cannot fit refuses the request)."""
    for r in reqs:
        rest = CTX - max(r["n_prompts"])
        mt = 1 + int(r["u"] * 8) if not r["long"] else 1 + int(r["u"] * rest)
        r["body"]["max_tokens"] = gen = min(mt, rest)
        n = r["body"].get("n", 1)
        r["never_fits_at"] = None
        for k, n_prompt in enumerate(r["n_prompts"]):
            need = -(-(n_prompt + gen) // BLOCK) + (n - 1) * (-(-gen // BLOCK) + 1)
            if need > POOL_BLOCKS and r["never_fits_at"] is None:
                r["never_fits_at"] = k
        r["never_fits"] = r["never_fits_at"] is not None
        if r["never_fits"] and not r["stream"]:
            r["cancel"] = None  # a client gone before the answer could not see the refusal
        if r["stream"]:
            r["body"]["stream"] = True


def post(srv, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        return resp.status, resp.read()
    finally:
        c.close()


def texts_of_answer(r, data):
    """Each choice's text and finish reason from a whole answer."""
    j = json.loads(data)
    out = [None] * n_choices(r)
    for ch in j["choices"]:
        t = ch["message"]["content"] if r["chat"] else ch["text"]
        out[ch["index"]] = (t, ch["finish_reason"])
    return out


def run_one(srv, r, cancel):
    """Send r; returns (kind, detail, texts). kind: complete, refused,
    cancelled, or an unintended kind. texts: [(text, finish)] per choice."""
    path = "/v1/chat/completions" if r["chat"] else "/v1/completions"
    n = n_choices(r)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    try:
        c.request("POST", path, body=json.dumps(r["body"]), headers={"Content-Type": "application/json"})
        if cancel and not r["stream"]:
            time.sleep(r["cancel"])  # gone before the answer: the server must notice and cancel
            c.sock.shutdown(socket.SHUT_RDWR)
            return "cancelled", "", None
        resp = c.getresponse()
        if resp.status != 200:
            data = resp.read()
            try:
                e = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                return "bad-error", "status %d: %r" % (resp.status, data[:200]), None
            msg = e.get("message") or ""
            if resp.status == 429 and e.get("code") == "server_busy" and resp.getheader("Retry-After"):
                return "busy", msg, None
            if resp.status == 400 and e.get("code") == "context_length_exceeded" and "KV blocks" in msg:
                return "refused", msg, None
            return "status-%d" % resp.status, e.get("message"), None
        if not r["stream"]:
            return "complete", "", texts_of_answer(r, resp.read())
        texts, finish, events = [""] * n, [None] * n, 0
        for raw in resp:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                if None in finish:
                    return "truncated", "[DONE] before every choice finished: %r" % finish, None
                return "complete", "", list(zip(texts, finish))
            j = json.loads(payload)
            if "error" in j:
                return "stream-error", j["error"].get("message"), None
            for ch in j.get("choices", []):
                k = ch["index"]
                texts[k] += (ch["delta"].get("content") or "") if r["chat"] else ch["text"]
                if ch.get("finish_reason"):
                    finish[k] = ch["finish_reason"]
            events += 1
            if cancel and events >= r["cancel"]:
                c.sock.shutdown(socket.SHUT_RDWR)  # gone mid-stream
                return "cancelled", "", [(t, None) for t in texts]
        return "truncated", "the stream ended without [DONE]", None
    except (OSError, ValueError, http.client.HTTPException) as e:
        return "exception", repr(e), None
    finally:
        c.close()


def load(srv, reqs, cancels):
    """Every request from CLIENTS threads; returns {i: (kind, detail, texts)}."""
    todo = list(reversed(reqs))
    out = {}

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                r = todo.pop()
            res = run_one(srv, r, cancels and r["cancel"] is not None)
            with lock:
                out[r["i"]] = res

    ts = [threading.Thread(target=worker, daemon=True) for _ in range(CLIENTS)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(1, DEADLINE - (time.time() - t0)))
    return out, time.time() - t0


def evaluate(reqs, got, ref, busy):
    """Each request's outcome against what it may be; (counts by kind,
    unintended outcomes)."""
    counts, unintended = {}, []
    for r in reqs:
        i = r["i"]
        if i not in got:
            counts["hung"] = counts.get("hung", 0) + 1
            unintended.append("%d: no answer within %d s" % (i, DEADLINE))
            continue
        kind, detail, texts = got[i]
        counts[kind] = counts.get(kind, 0) + 1
        if r["never_fits"]:
            # refused by the first prompt that cannot fit, unless one before it found the queue full
            want = ("refused", "busy") if busy and r["never_fits_at"] > 0 else ("refused",)
        else:
            want = ("cancelled", "complete", "busy") if busy else ("cancelled", "complete")
        if kind not in want:
            unintended.append("%d: %s, expected %s (prompts %s, max_tokens %d, n %d): %s" % (
                i, kind, "/".join(want), r["n_prompts"], r["body"]["max_tokens"], r["body"].get("n", 1), detail))
            continue
        expect = ref[i][2]
        if kind == "complete":
            if texts != expect:
                unintended.append("%d: %r differs from the roomy server's %r" % (i, texts, expect))
        elif kind == "cancelled" and texts is not None:
            for k, (t, _) in enumerate(texts):
                if not expect[k][0].startswith(t):
                    unintended.append("%d: cancelled choice %d's %r is no prefix of %r" % (i, k, t, expect[k][0]))
    return counts, unintended


def pressure(srv, name, reqs, ref, busy):
    m0 = srv.metrics()
    result("%s: a pool of %d blocks" % (name, POOL_BLOCKS), m0.get("lamina_kv_blocks_total") == POOL_BLOCKS,
           m0.get("lamina_kv_blocks_total"))
    got, dt = load(srv, reqs, cancels=True)
    counts, unintended = evaluate(reqs, got, ref, busy)
    print("NOTE %s: %d requests (%d streaming, %d with n > 1, %d with two prompts, %d chat) from %d clients in "
          "%.1f s: %s" % (name, TOTAL, sum(1 for r in reqs if r["stream"]),
                          sum(1 for r in reqs if r["body"].get("n", 1) > 1),
                          sum(1 for r in reqs if len(r["n_prompts"]) > 1), sum(1 for r in reqs if r["chat"]), CLIENTS,
                          dt, ", ".join("%d %s" % (v, k) for k, v in sorted(counts.items()))))
    result("%s: every request complete (the roomy text), refused as too long%s, or cancelled" % (
        name, ", busy (429)" if busy else ""),
        not unintended, "%d unintended:\n%s" % (len(unintended), "\n".join(unintended[:12])))
    kinds = ("complete", "refused", "cancelled") + (("busy",) if busy else ())
    result("%s: each intended outcome happened" % name, all(counts.get(k, 0) > 0 for k in kinds), counts)
    result("%s: healthy afterwards" % name, srv.get("/health")[0] == 200)
    ok, m = srv.wait_idle()
    result("%s: nothing running or waiting, no KV block held" % name, ok, m)
    result("%s: every KV block free" % name,
           m.get("lamina_kv_blocks_free") == m.get("lamina_kv_blocks_total") == POOL_BLOCKS,
           "free %s of %s" % (m.get("lamina_kv_blocks_free"), m.get("lamina_kv_blocks_total")))
    result("%s: every accepted request finished" % name,
           m.get("lamina_requests_finished_total") == m.get("lamina_requests_total") > 0,
           "%s finished of %s" % (m.get("lamina_requests_finished_total"), m.get("lamina_requests_total")))
    if busy:
        result("%s: the engine counted the refusals" % name, m.get("lamina_requests_rejected_total", 0) > 0,
               m.get("lamina_requests_rejected_total"))
    pre = m.get("lamina_preemptions_total", 0)
    print("NOTE %s: %d preemptions, %d KV blocks cached for prefix reuse" % (name, pre,
                                                                           m.get("lamina_kv_blocks_cached", 0)))
    if not busy:  # (with most requests turned away, preemption is likely but not certain)
        result("%s: sequences were preempted and recomputed" % name, pre > 0, pre)


def main():
    if not os.path.exists(LAMINA):
        result("a lamina binary at %s" % LAMINA, False)
        return summary()
    servers = []
    try:
        reqs = make_requests()
        roomy = Server()
        servers.append(roomy)
        prompt_tokens(roomy, reqs)
        finish_requests(reqs)
        ref, dt = load(roomy, reqs, cancels=False)
        bad = ["%d: %s %s" % (i, k, d) for i, (k, d, _) in sorted(ref.items()) if k != "complete"]
        result("roomy server: every request complete", len(ref) == TOTAL and not bad,
               "%d answered of %d\n%s" % (len(ref), TOTAL, "\n".join(bad[:10])))
        m = roomy.metrics()
        result("roomy server: no preemption", m.get("lamina_preemptions_total") == 0, m.get("lamina_preemptions_total"))
        print("NOTE roomy server: %d requests in %.1f s" % (TOTAL, dt))
        roomy.stop("roomy server")
        servers.remove(roomy)

        # the pool of a few blocks; then the same with a queue of at most 16
        # waiting requests, where 429 (busy) is one more intended outcome
        for name, extra in (("pressure", []), ("pressure, --max-waiting 16", ["--max-waiting", "16"])):
            srv = Server("--kv-mem", str(POOL_BLOCKS * BLOCK_BYTES), *extra)
            servers.append(srv)
            pressure(srv, name, reqs, ref, busy=bool(extra))
            srv.stop(name + " server")
            servers.remove(srv)
    except Exception:
        import traceback
        result("e2e_pressure ran to the end", False, traceback.format_exc())
    finally:
        for s in servers:
            s.stop("server")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
