#!/usr/bin/env python3
"""End-to-end checks of structured outputs and tool calls in `lamina serve`,
through the official `openai` Python client, on models whose preferences the
checks do not depend on: whatever a model would say, the constraint must
make every answer valid.

Models and servers (each started here with --port 0 and stopped with SIGTERM:
exit status 0, nothing from the sanitizers):
  - the bundled model (models/stories260K.gguf), ChatML template (the
    Hermes tool syntax), context stretched to 2048 for the tools' prompt;
  - a random-weight model written by `lamina mkmodel` (the bundled
    vocabulary), once with the llama3 template (Llama 3.1's JSON calls),
    once with mistral-v3 ([TOOL_CALLS]) and once with qwen3.5 (Qwen3.5's
    XML calls, <function=...><parameter=...>, read back into JSON
    arguments; its requests turn thinking off, as the template's prompt
    otherwise opens the reasoning, which constraints wait out:
    tests/e2e_reasoning.py);
  - the bundled model again with a tiny KV pool (--kv-mem), for preemption.
tests/e2e_tools_gemma3.py runs a lighter set of the same checks on Gemma 3
270M (a real model, whose template has no tool format: the Hermes fallback).

The client runs in the virtual environment e2e_server.py installs
($LAMINA_CACHE/venv-openai: openai, with pydantic), into which this test adds
jsonschema (tests/openai_env.py, which also holds the client script's head
and the server e2e_reasoning.py shares); when that cannot be had the checks
count as skipped.

Checks, per model: response_format json_schema over a set of schemas
(objects, enums, arrays, nested objects, $defs references, anyOf, bounded
strings and integers) streamed and not, each output parsed and validated
with jsonschema, streamed text equal to the whole answer for the same seed;
json_object; client.beta.chat.completions.parse with a pydantic model; tool
calls with tool_choice required, a named function and parallel_tool_calls
false, arguments validated against the tool's schema, no call repeating an
earlier one (the bundled model, left free to go on, repeats its call until
max_tokens), the streamed deltas (index, id, type and name first, then
arguments in pieces; indices without gaps) adding up to the whole answer's
calls; a round trip (call -> tool message -> answer);
auto leaves free text free (same as none when no call is made). Then 400s
for a bad grammar, a bad schema and an unknown tool_choice name, and for
highly ambiguous grammars (found at submission, or while generating: then
the request ends with an error and the grammar is refused from then on); batch
invariance (a constrained request's output alone and among free ones) and
preemption with constrained requests mixed among free ones (every output
equal to its solo output, preemptions counted in /metrics).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
ASAN = bool(os.environ.get("LAMINA_ASAN"))
import testenv  # noqa: E402 (tests/ is the script's folder)
from testenv import CACHE, result, skip, summary  # noqa: E402
# (e2e_smollm2.py and e2e_tools_gemma3.py take Server and client_python from here)
from openai_env import CLIENT_HEAD, Server, client_python, run_script  # noqa: E402
GEMMA = os.path.join(CACHE, "gemma-3-270m-q4_k_m.gguf")

# ------------------------------------------------------------ the client

CLIENT = r'''
import threading, time
from typing import List, Literal
import jsonschema, pydantic
M, QUICK, LIGHT = cfg["model"], cfg["quick"], cfg.get("light", False)
MT = cfg["max_tokens"]
if cfg.get("no_think"):
    # a thinking template (qwen3.5 opens the reasoning in its prompt): constraints wait for the
    # reasoning to end, which a random model never writes; thinking off, they hold at once
    def no_think(create):
        def call(*a, **kw):
            eb = dict(kw.pop("extra_body", None) or {})
            eb.setdefault("chat_template_kwargs", {"enable_thinking": False})
            return create(*a, extra_body=eb, **kw)
        return call
    client.chat.completions.create = no_think(client.chat.completions.create)
    client.beta.chat.completions.parse = no_think(client.beta.chat.completions.parse)

def run(name, fn):
    try:
        fn()
    except Exception as e:
        check(name, False, "%s: %s" % (type(e).__name__, e))

S = lambda n: {"type": "string", "maxLength": n}
SCHEMAS = [
    {"type": "object", "properties": {"name": S(8), "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                      "none": {"type": "null"}}, "required": ["color", "ok", "none"]},
    {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"},
                                                                              "tags": {"type": "array", "items": S(4),
                                                                                       "maxItems": 2}},
                                              "required": ["kind", "tags"], "additionalProperties": False}},
     "required": ["pet"], "additionalProperties": False},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                                                       "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
     "required": ["a", "b"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "boolean"}, S(3)]},
]
if QUICK:
    SCHEMAS = SCHEMAS[:1] if LIGHT else SCHEMAS[:2]
MSGS = [{"role": "user", "content": "Give me the data."}]

def schema_outputs():
    for i, schema in enumerate(SCHEMAS):
        rf = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": schema, "strict": True}}
        r = client.chat.completions.create(model=M, messages=MSGS, response_format=rf, max_tokens=MT, temperature=1.0,
                                           seed=100 + i)
        text = r.choices[0].message.content
        try:
            jsonschema.validate(json.loads(text), schema)
            ok = r.choices[0].finish_reason == "stop"
        except Exception as e:
            ok = False
            text = "%r: %s" % (text, e)
        check("schema %d: the answer validates" % i, ok, "%s (%s)" % (text, r.choices[0].finish_reason))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=M, messages=MSGS, response_format=rf, max_tokens=MT, temperature=1.0, seed=100 + i, stream=True)
            if ch.choices)
        check("schema %d: streamed equals whole" % i, streamed == r.choices[0].message.content,
              "%r != %r" % (streamed, r.choices[0].message.content))
    if LIGHT:
        return
    # completions route too, and json_object
    r = client.completions.create(model=M, prompt="Data:", max_tokens=MT, temperature=1.0, seed=5,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "c", "schema": SCHEMAS[0]}}})
    ok = True
    try:
        jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS[0])
    except Exception as e:
        ok = False
    check("completions with a schema validate", ok, r.choices[0].text)
    r = client.chat.completions.create(model=M, messages=MSGS, response_format={"type": "json_object"},
                                       max_tokens=MT, temperature=1.0, seed=3)
    try:
        ok = isinstance(json.loads(r.choices[0].message.content), dict) or r.choices[0].finish_reason == "length"
    except Exception:
        ok = r.choices[0].finish_reason == "length"
    check("json_object is a JSON object", ok, r.choices[0].message.content)

class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    kind: Literal["cat", "dog", "bird"]
    legs: int = pydantic.Field(ge=0, le=4)
    tags: List[Literal["old", "new"]] = pydantic.Field(max_length=2)

def parse_pydantic():
    r = client.beta.chat.completions.parse(model=M, messages=MSGS, response_format=Pet, max_tokens=MT, temperature=1.0,
                                           seed=21)
    p = r.choices[0].message.parsed
    check("beta.chat.completions.parse gives the pydantic model", isinstance(p, Pet) and 0 <= p.legs <= 4, r)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": S(12), "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone",
    "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
                   "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Weather in Paris?"}]

def valid_calls(calls, names=None, finish="tool_calls"):
    """Every call well formed and its arguments valid; when the answer ran
    out of tokens (the model preferring call after call), the last call may
    be cut short: it must then be a prefix of the call's text."""
    if not calls:
        return False, "no calls"
    if finish not in ("tool_calls", "length"):
        return False, "finish %s" % finish
    ids = set()
    for k, c in enumerate(calls):
        if finish == "length" and k == len(calls) - 1:
            try:
                json.loads(c.function.arguments)
            except ValueError:
                if c.function.name not in SCHEMA_OF or not c.id or c.id in ids:
                    return False, "bad cut call %r" % c
                continue
        if c.type != "function" or c.function.name not in SCHEMA_OF or (names and c.function.name not in names):
            return False, "bad call %r" % c
        try:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMA_OF[c.function.name])
        except Exception as e:
            return False, "%r: %s" % (c.function.arguments, e)
        if not c.id or c.id in ids:
            return False, "ids %r" % [x.id for x in calls]
        ids.add(c.id)
    return True, ""

def squeeze(text):
    """JSON text without the blanks between its tokens (the server's test for a repeated call)."""
    out, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
        elif ch in " \t\n\r":
            continue
        else:
            in_str = ch == '"'
        out.append(ch)
    return "".join(out)

def repeats(calls):
    """The calls [(name, arguments)] that repeat an earlier one."""
    seen, rep = set(), []
    for name, args in calls:
        key = (name, squeeze(args))
        if key in seen:
            rep.append((name, args))
        seen.add(key)
    return rep

def stream_calls(**kw):
    """The streamed answer: content, calls [(id, name, arguments)], finish reason, first deltas well formed."""
    content, calls, finish, shape = "", {}, None, True
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or []:
                if tc.index not in calls:
                    shape &= bool(tc.id) and tc.type == "function" and bool(tc.function.name) and \
                        tc.function.arguments == ""
                    calls[tc.index] = [tc.id, tc.function.name, ""]
                else:
                    shape &= tc.id is None and tc.function.name is None
                    calls[tc.index][2] += tc.function.arguments or ""
    shape &= sorted(calls) == list(range(len(calls)))  # indices 0, 1, 2, ... without gaps
    return content, [tuple(calls[k]) for k in sorted(calls)], finish, shape

def tools_required():
    cases = [("required", None, True), ({"type": "function", "function": {"name": "get_time"}}, ["get_time"], True),
             ("required", None, False)]
    if LIGHT:  # one call each: a slow model is not left calling until max_tokens
        cases = [({"type": "function", "function": {"name": "get_time"}}, ["get_time"], False), cases[2]]
    for choice, names, par in cases:
        kw = dict(model=M, messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=par, max_tokens=MT,
                  temperature=1.0, seed=7)
        r = client.chat.completions.create(**kw)
        m, fr = r.choices[0].message, r.choices[0].finish_reason
        ok, why = valid_calls(m.tool_calls, names, fr if par else "tool_calls")
        one = not par or names is not None  # a named function is called once, parallel or not
        what = "tool_choice %s%s" % (json.dumps(choice), ", one call" if one else "")
        check(what + ": calls validate", ok and (not one or len(m.tool_calls) == 1) and not m.content,
              "%s; %s, finish %s" % (why, m, fr))
        if not ok:
            continue
        whole = [(c.function.name, c.function.arguments) for c in m.tool_calls]
        check(what + ": each call once (no repeat of an earlier call)", not repeats(whole), whole)
        content, calls, finish, shape = stream_calls(**kw)
        check(what + ": streamed deltas add up to the whole answer", [(c[1], c[2]) for c in calls] == whole and
              finish == fr and shape and content == "", "%r / %r, %s, shape %s" % (calls, whole, finish, shape))

def round_trip():
    r = client.chat.completions.create(model=M, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=MT,
                                       temperature=1.0, seed=11, parallel_tool_calls=not LIGHT)
    m = r.choices[0].message
    ok, why = valid_calls(m.tool_calls, None, r.choices[0].finish_reason)
    if ok and r.choices[0].finish_reason == "length":
        m.tool_calls = m.tool_calls[:-1] or m.tool_calls  # a cut last call is not sent back
    if not ok:
        check("round trip: first call", False, why)
        return
    msgs = ASK + [m.model_dump(exclude_none=True)]
    for c in m.tool_calls:
        msgs.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"result": "sunny, 18 C"})})
    for choice in ("auto",) if LIGHT else ("none", "auto"):
        r2 = client.chat.completions.create(model=M, messages=msgs, tools=TOOLS, tool_choice=choice, max_tokens=24,
                                            temperature=0.7, seed=12)
        m2, fr = r2.choices[0].message, r2.choices[0].finish_reason
        if m2.tool_calls:
            print("NOTE %s: with tool_choice auto the model called %s after the tool's answer" %
                  (TAG, [c.function.name for c in m2.tool_calls]))
            ok, why = valid_calls(m2.tool_calls, None, fr)
            ok = ok and choice == "auto"
        else:
            ok, why = isinstance(m2.content, str) and fr in ("stop", "length"), m2
        check("round trip: answer after the tool message (tool_choice %s)" % choice, ok, why)
        # the same conversation streamed
        content, calls, finish, shape = stream_calls(model=M, messages=msgs, tools=TOOLS, tool_choice=choice,
                                                     max_tokens=24, temperature=0.7, seed=12)
        same = (content == (m2.content or "")) and [(c[1], c[2]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in m2.tool_calls or []]
        check("round trip: streamed equals whole (tool_choice %s)" % choice, same, "%r %r / %r" % (content, calls, m2))

def auto_free():
    kw = dict(model=M, messages=ASK, tools=TOOLS, max_tokens=24, temperature=0.9, seed=31)
    a = client.chat.completions.create(tool_choice="auto", **kw).choices[0]
    n = client.chat.completions.create(tool_choice="none", **kw).choices[0]
    if a.message.tool_calls:
        ok, why = valid_calls(a.message.tool_calls, None, a.finish_reason)
        check("auto: the model called, and the call validates", ok, why)
    else:
        check("auto: free text stays free (same as tool_choice none)", a.message.content == n.message.content,
              "%r != %r" % (a.message.content, n.message.content))

def errors():
    cases = [("bad grammar", dict(messages=MSGS, extra_body={"grammar": "root ::= \"unterminated"}), "grammar"),
             ("undefined rule", dict(messages=MSGS, extra_body={"grammar": "root ::= nothing-here"}), "grammar"),
             ("bad schema", dict(messages=MSGS, response_format={"type": "json_schema", "json_schema": {
                 "name": "x", "schema": {"type": "object", "notAKeyword": 1}}}), "response_format"),
             ("bad json_schema field", dict(messages=MSGS, extra_body={"json_schema": {"type": "nonsense"}}),
              "json_schema"),
             ("unknown tool_choice name", dict(messages=ASK, tools=TOOLS, tool_choice={
                 "type": "function", "function": {"name": "launch_rocket"}}), "tool_choice")]
    for name, kw, param in cases:
        try:
            client.chat.completions.create(model=M, max_tokens=4, **kw)
            check("400 for a %s" % name, False, "accepted")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check("400 for a %s" % name, e.status_code == 400 and body.get("param") == param and body.get("message"),
                  body)

# Grammars whose parse stacks double with every "x" (each x may open a
# nested r whose continuation differs by alternative): the server must refuse
# them quickly instead of following the stacks for seconds. The first is
# found when the grammar is submitted (400); the second hides the doubling
# behind a literal longer than the states explored at submission, so it is
# found while generating (the request ends with an error); sent again it is
# refused again (at submission when the engine kept the compiled grammar,
# which test_engine_grammar checks; here the engine's table of grammars may
# be full from the checks before).
AMBIGUOUS = 'root ::= r\nr ::= "x" r "x"? | "x" r ("x" "x")? | "x"\n'
HIDDEN = 'root ::= "%s" r\nr ::= "x" r "x"? | "x" r ("x" "x")? | "x"\n' % ("a" * 120)

def ambiguous():
    def attempt(grammar):
        t0 = time.time()
        try:
            client.completions.create(model=M, prompt="x", max_tokens=400, temperature=0,
                                      extra_body={"grammar": grammar, "ignore_eos": True})
            return None, None, time.time() - t0
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            return e.status_code, body.get("message") or "", time.time() - t0
    for name, grammar in [("at submission", AMBIGUOUS), ("while generating", HIDDEN),
                          ("again", HIDDEN)]:
        code, msg, dt = attempt(grammar)
        print("  ambiguous grammar %s: %s in %.2f s: %s" % (name, code, dt, msg))
        check("an ambiguous grammar is refused %s: 400 saying so" % name,
              code == 400 and "too ambiguous" in (msg or ""), (code, msg))
        check("an ambiguous grammar is refused %s within 30 s (not minutes)" % name, dt < 30, dt)
    check("the server still answers after ambiguous grammars",
          client.completions.create(model=M, prompt="x", max_tokens=4).choices[0].text is not None)

def batch_invariance():
    rf = {"type": "json_schema", "json_schema": {"name": "b", "schema": SCHEMAS[0]}}
    kw = dict(model=M, messages=MSGS, response_format=rf, max_tokens=MT, temperature=1.0, seed=77)
    alone = client.chat.completions.create(**kw).choices[0].message.content
    got, free = [None], []

    def constrained():
        got[0] = client.chat.completions.create(**kw).choices[0].message.content

    def other(i):
        free.append(client.completions.create(model=M, prompt="Once upon a time %d" % i, max_tokens=40,
                                              temperature=1.0, seed=i, extra_body={"ignore_eos": True}))

    ts = [threading.Thread(target=other, args=(i,)) for i in range(5)] + [threading.Thread(target=constrained)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check("batch invariance: constrained output alone == among free requests", got[0] == alone and len(free) == 5,
          "%r vs %r" % (got[0], alone))

for name, fn in [("schemas", schema_outputs), ("pydantic", parse_pydantic), ("tools", tools_required),
                 ("round trip", round_trip), ("auto", auto_free), ("errors", errors), ("ambiguous", ambiguous),
                 ("batch", batch_invariance)]:
    if name in cfg["skip"]:
        continue
    run(name, fn)
'''

PREEMPT = r'''
import threading, urllib.request
import jsonschema
M = cfg["model"]
schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 20},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["w", "n"], "additionalProperties": False}

def req(i):
    if i % 2 == 0:
        return client.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "Item %d" % i}], max_tokens=80, temperature=1.0, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
        ).choices[0].message.content
    return client.completions.create(model=M, prompt="Once upon a time %d" % i, max_tokens=80, temperature=1.0,
                                     seed=i, extra_body={"ignore_eos": True}).choices[0].text

N = 8
solo = [req(i) for i in range(N)]
out = [None] * N
def run(i):
    try:
        out[i] = req(i)
    except Exception as e:
        out[i] = "error: %s" % e
ts = [threading.Thread(target=run, args=(i,)) for i in range(N)]
for t in ts:
    t.start()
for t in ts:
    t.join()
valid = True
for i in range(0, N, 2):
    try:
        jsonschema.validate(json.loads(out[i]), schema)
    except Exception:
        valid = False
print(json.dumps({"same": out == solo, "valid": valid, "out": out, "solo": solo}))
'''


N_CHECKS = 30  # roughly what one model's client run reports (for skips)


def run_client(py, srv, tag, model_name, quick=False, max_tokens=300, skip_parts=(), light=False, no_think=False):
    t0 = time.time()
    cfg = {"base": srv.base(), "model": model_name, "tag": tag, "quick": quick, "max_tokens": max_tokens,
           "skip": list(skip_parts), "light": light, "no_think": no_think}
    n = run_script(py, CLIENT, cfg, 1800)
    print("NOTE %s: %d checks in %.0f s" % (tag, n, time.time() - t0))


def main():
    py, why = client_python()
    if not py:
        skip("openai client checks", "could not install openai/jsonschema (%s)" % why, N_CHECKS)
        return summary()
    servers = []
    tmp = tempfile.mkdtemp(prefix="lamina-tools-")
    try:
        # 1. the bundled model, ChatML (Hermes syntax)
        srv = Server(MODEL, "--chat-template", "chatml", "-c", "2048", "--ctx-extend")
        servers.append((srv, "bundled"))
        run_client(py, srv, "bundled/chatml", "stories260K.gguf")

        # 2. random weights, Llama 3.1, Mistral v3 and Qwen3.5 tool syntaxes
        rnd = os.path.join(tmp, "random.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "-o", rnd, "--layers", "2", "--embd", "64", "--heads", "4",
                            "--kv-heads", "2", "--ff", "128", "--ctx", "2048", "--vocab-from", MODEL, "--seed", "5"],
                           capture_output=True, text=True, timeout=300)
        result("mkmodel writes a random-weight model", r.returncode == 0, r.stderr)
        for fam in ("llama3", "mistral-v3", "qwen3.5"):
            srv = Server(rnd, "--chat-template", fam)
            servers.append((srv, "random/" + fam))
            run_client(py, srv, "random/" + fam, "random.gguf", quick=True, skip_parts=("batch",),
                       no_think=fam == "qwen3.5")

        # 3. preemption: a pool of about three sequences, eight requests at once
        srv = Server(MODEL, "--chat-template", "chatml", "--kv-mem", "100K", "--max-seqs", "8")
        servers.append((srv, "preempt"))
        before = srv.metric("lamina_preemptions_total") or 0
        cfg = {"base": srv.base(), "model": "stories260K.gguf", "tag": "preempt"}
        r = subprocess.run([py, "-c", CLIENT_HEAD + PREEMPT, json.dumps(cfg)], capture_output=True, text=True,
                           timeout=1800)
        try:
            res = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res = {}
        pre = (srv.metric("lamina_preemptions_total") or 0) - before
        print("NOTE preemption: %d preemptions for 8 requests at once" % pre)
        result("preemption: constrained outputs validate", res.get("valid") is True, r.stdout[-2000:] + r.stderr[-2000:])
        result("preemption: every output equals its solo output", res.get("same") is True, res)
        result("preemption happened", pre > 0, pre)

    except Exception:
        import traceback
        result("e2e_tools ran to the end", False, traceback.format_exc())
    finally:
        for srv, name in servers:
            srv.stop(name)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
