#!/usr/bin/env python3
"""End-to-end checks of reasoning kept apart from the answer in `lamina
serve`, through the official `openai` Python client.

A random-weight model written by `lamina mkmodel` (the bundled vocabulary)
says random things; its output is made predictable by a raw "grammar"
request field, which holds the whole output, reasoning included:
<think>\\nThinking WORD\\n</think>\\n\\nAnswer N. (qwen3, whose model opens the
block) or the same without the opening tag (qwen3.5 and deepseek-r1, whose
generation prompts open it); gpt-oss's harmony channels the same way,
<|channel|>analysis<|message|>Thinking WORD<|end|><|start|>assistant
<|channel|>final<|message|>Answer N. (in this vocabulary the markers are
plain text; in gpt-oss's own they are control tokens, whose text the server
asks the engine for; a second gpt-oss model takes the harmony test
vocabulary, tests/data/vocab/ggml-vocab-harmony.gguf, whose markers are
tokens of their own). Servers, each started here with --port 0 and stopped
with SIGTERM: the model under the qwen3, qwen3.5, deepseek-r1 and gpt-oss
templates (--chat-template), and once more under qwen3.5 with
--reasoning-format inline.

Checks, per template: the whole answer's message.reasoning_content and
content (no marker in either), the streamed delta.reasoning_content and
delta.content adding up to the same for the same seed (no marker in any
delta), reasoning before content in the stream; "reasoning_format":
"inline" (and the inline server) giving the old form (the raw text in
content, no reasoning_content); reasoning cut by max_tokens (all of it
reasoning, finish_reason length); thinking off (enable_thinking false: the
answer at once, reasoning_content null; not deepseek-r1, whose template has
no switch); a Hermes (qwen3) or XML (qwen3.5)
tool call after the reasoning read into tool_calls, whole and streamed;
response_format json_schema with thinking off: valid JSON in content; the
history round trip (an assistant message with reasoning_content accepted).
gpt-oss: the analysis channel as reasoning_content and the final channel as
content, whole and streamed, inline on request, cut inside the analysis,
and a commentary-channel call to functions.get_weather read into
tool_calls, whole and streamed; on the harmony test vocabulary,
tool_choice "required" and a named function under the call grammar (a
logit bias on <|end|>, the trigger, which a random model never writes by
itself): one call whose arguments the test checks against its tool's
schema, whole for three seeds and streamed, and no call with "auto". And `lamina run --chat` under qwen3.5 and gpt-oss: only the answer on
stdout, the reasoning on stderr with --show-reasoning.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

LAMINA = os.environ.get("LAMINA_BIN", "build/lamina")
MODEL = "models/stories260K.gguf"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testenv import result, skip, summary  # noqa: E402
from openai_env import Server, client_python, run_script  # noqa: E402

CLIENT = r'''
import re
M, OPEN, INLINE = cfg["model"], cfg["open"], cfg["inline"]
XML, SWITCH = cfg["xml"], cfg["switch"]

def ext(m, key):
    v = getattr(m, key, None)
    if v is None and getattr(m, "model_extra", None):
        v = m.model_extra.get(key)
    return v

MSG = [{"role": "user", "content": "What is 2 + 2?"}]
HEAD = '"<think>\\n" ' if not OPEN else ''
G = 'root ::= ' + HEAD + '"Thinking " [a-z]{1,8} "\\n</think>\\n\\n" "Answer " [0-9]{1,3} "."'
RAW = re.compile(r'^(<think>\n)?Thinking [a-z]{1,8}\n</think>\n\nAnswer [0-9]{1,3}\.$')

def whole(extra, **kw):
    r = client.chat.completions.create(model=M, messages=kw.pop("messages", MSG), max_tokens=kw.pop("max_tokens", 60),
                                       seed=kw.pop("seed", 7), extra_body=extra, **kw)
    return r.choices[0]

def streamed(extra, **kw):
    s = client.chat.completions.create(model=M, messages=kw.pop("messages", MSG), max_tokens=kw.pop("max_tokens", 60),
                                       seed=kw.pop("seed", 7), extra_body=extra, stream=True, **kw)
    rs, cs, order, calls, finish = [], [], [], {}, None
    for ch in s:
        if not ch.choices:
            continue
        c = ch.choices[0]
        d = c.delta
        r = ext(d, "reasoning_content")
        if r:
            rs.append(r); order.append("r")
        if d.content:
            cs.append(d.content); order.append("c")
        for t in d.tool_calls or []:
            e = calls.setdefault(t.index, {"name": "", "args": ""})
            if t.function and t.function.name:
                e["name"] += t.function.name
            if t.function and t.function.arguments:
                e["args"] += t.function.arguments
        if c.finish_reason:
            finish = c.finish_reason
    return rs, cs, order, calls, finish

if cfg.get("harmony"):
    A = '"<|channel|>analysis<|message|>Thinking " [a-z]{1,8} "<|end|>"'
    G = 'root ::= ' + A + ' "<|start|>assistant<|channel|>final<|message|>Answer " [0-9]{1,3} "."'
    MT = 200  # the markers are plain text here, a few characters a token
    c = whole({"grammar": G}, max_tokens=MT)
    rc, ct = ext(c.message, "reasoning_content"), c.message.content
    check("whole: analysis channel as reasoning_content", re.fullmatch(r"Thinking [a-z]{1,8}", rc or ""), c.message)
    check("whole: final channel as content", re.fullmatch(r"Answer [0-9]{1,3}\.", ct or ""), ct)
    rs, cs, order, _, fin = streamed({"grammar": G}, max_tokens=MT)
    check("stream: deltas add up to the whole", "".join(rs) == rc and "".join(cs) == ct, (rs, cs))
    check("stream: no marker in any delta", all("<|" not in p and "|>" not in p for p in rs + cs), rs + cs)
    check("stream: reasoning before content", order == sorted(order, key=lambda k: k != "r") and "c" in order, order)
    c = whole({"grammar": G, "reasoning_format": "inline"}, max_tokens=MT)
    check("reasoning_format inline: the channels as they are",
          (c.message.content or "").startswith("<|channel|>analysis<|message|>Thinking ")
          and "<|channel|>final<|message|>Answer " in c.message.content and not ext(c.message, "reasoning_content"),
          c.message)
    c = whole({"grammar": G}, max_tokens=40)
    rc3 = ext(c.message, "reasoning_content") or ""
    check("cut inside the analysis channel: reasoning only, length",
          c.finish_reason == "length" and rc3.startswith("Thin") and not c.message.content and "<|" not in rc3,
          (c.finish_reason, rc3, c.message.content))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    gt = ('root ::= ' + A + ' "<|start|>assistant<|channel|>commentary to=functions.get_weather '
          '<|constrain|>json<|message|>{\\"city\\": \\"" [A-Z] [a-z]{1,6} "\\"}"')
    c = whole({"grammar": gt}, tools=tools, max_tokens=200)
    tc = c.message.tool_calls or []
    args = json.loads(tc[0].function.arguments) if tc else {}
    rc = ext(c.message, "reasoning_content")
    check("commentary call after reasoning: whole", len(tc) == 1 and tc[0].function.name == "get_weather"
          and re.fullmatch(r"[A-Z][a-z]{1,6}", args.get("city", "")) and c.finish_reason == "tool_calls"
          and re.fullmatch(r"Thinking [a-z]{1,8}", rc or "") and not c.message.content, c.message)
    rs, cs, _, calls, fin = streamed({"grammar": gt}, tools=tools, max_tokens=200)
    check("commentary call after reasoning: streamed", "".join(rs) == rc and not cs and list(calls) == [0]
          and calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == args and fin == "tool_calls",
          (rs, cs, calls, fin))
    c = whole({"grammar": G}, messages=MSG + [{"role": "assistant", "content": "Answer 4.",
                                               "reasoning_content": "Thinking hard"},
                                              {"role": "user", "content": "And 3 + 3?"}], max_tokens=MT)
    check("history with reasoning_content accepted", re.fullmatch(r"Answer [0-9]{1,3}\.", c.message.content or ""),
          c.message)
    if cfg.get("end_id") is not None:
        # tool_choice required / a named function: the call's grammar starts at
        # the analysis' end, <|end|>, which a random model never writes by itself:
        # a logit bias makes it the first token (the grammar then masks it out)
        htools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                      "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
                      "required": ["city"], "additionalProperties": False}}},
                  {"type": "function", "function": {"name": "add", "parameters": {
                      "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"], "additionalProperties": False}}}]

        def valid(name, a):  # the tool's schema, checked by hand
            if name == "get_weather":
                return isinstance(a, dict) and set(a) == {"city"} and a["city"] in ("Oslo", "Rome")
            return (name == "add" and isinstance(a, dict) and set(a) == {"a", "b"}
                    and all(type(a[k]) is int for k in "ab"))
        bias = {str(cfg["end_id"]): 100}
        for label, choice, names in (("required", "required", ("get_weather", "add")),
                                     ("named add", {"type": "function", "function": {"name": "add"}}, ("add",))):
            for seed in (1, 2, 3):
                c = whole({}, tools=htools, tool_choice=choice, logit_bias=bias, max_tokens=300, seed=seed)
                tc = c.message.tool_calls or []
                try:
                    args = json.loads(tc[0].function.arguments) if tc else None
                except ValueError:
                    args = None
                check("tool_choice %s (seed %d): one call, its arguments valid for its schema" % (label, seed),
                      len(tc) == 1 and tc[0].function.name in names and valid(tc[0].function.name, args)
                      and c.finish_reason == "tool_calls" and not (c.message.content or "").strip(), c)
            rs, cs, _, calls, fin = streamed({}, tools=htools, tool_choice=choice, logit_bias=bias, max_tokens=300, seed=3)
            check("tool_choice %s, streamed: the same call" % label,
                  len(calls) == 1 and calls[0]["name"] == tc[0].function.name
                  and json.loads(calls[0]["args"]) == args and fin == "tool_calls", (rs, cs, calls, fin))
        # without the grammar the same bias gives no call: the grammar made it
        c = whole({}, tools=htools, tool_choice="auto", logit_bias=bias, max_tokens=60, seed=1)
        check("tool_choice auto, same bias: no call forced", not c.message.tool_calls, c)
elif not INLINE:
    c = whole({"grammar": G})
    rc, ct = ext(c.message, "reasoning_content"), c.message.content
    check("whole: reasoning_content apart", isinstance(rc, str) and re.fullmatch(r"Thinking [a-z]{1,8}", rc), rc)
    check("whole: content is only the answer", ct is not None and re.fullmatch(r"Answer [0-9]{1,3}\.", ct), ct)
    rs, cs, order, _, fin = streamed({"grammar": G})
    check("stream: reasoning deltas add up to the whole", "".join(rs) == rc, (rs, rc))
    check("stream: content deltas add up to the whole", "".join(cs) == ct, (cs, ct))
    check("stream: no marker in any delta", all("think>" not in p for p in rs + cs), rs + cs)
    check("stream: reasoning before content", order == sorted(order, key=lambda k: k != "r") and "c" in order, order)
    check("stream: finish_reason stop", fin == "stop", fin)
    # the old form on request
    c = whole({"grammar": G, "reasoning_format": "inline"})
    check("reasoning_format inline: raw text in content", RAW.match(c.message.content or ""), c.message.content)
    check("reasoning_format inline: no reasoning_content", not ext(c.message, "reasoning_content"), c.message)
    rs, cs, _, _, _ = streamed({"grammar": G, "reasoning_format": "inline"})
    check("reasoning_format inline, streamed: raw text", not rs and "".join(cs) == c.message.content, (rs, cs))
    # reasoning cut by max_tokens: all of it reasoning
    cut = 3 if OPEN else 12  # qwen3: past its own <think>
    c = whole({"grammar": G}, max_tokens=cut)
    rc3 = ext(c.message, "reasoning_content") or ""
    check("cut inside the reasoning: reasoning only, length",
          c.finish_reason == "length" and rc3 and (c.message.content or "") == "" and "think" not in rc3,
          (c.finish_reason, rc3, c.message.content))
    rs, cs, _, _, fin = streamed({"grammar": G}, max_tokens=cut)
    check("cut inside the reasoning, streamed", "".join(rs) == rc3 and not cs and fin == "length", (rs, cs, fin))
    # thinking off: the answer at once (deepseek-r1's template has no switch)
    ga = 'root ::= "Answer " [0-9]{1,3} "."'
    c = None if not SWITCH else whole({"grammar": ga, "chat_template_kwargs": {"enable_thinking": False}})
    SWITCH and check("thinking off: content only", re.fullmatch(r"Answer [0-9]{1,3}\.", c.message.content or "")
          and not ext(c.message, "reasoning_content"), c.message)
    # structured output with thinking off: JSON from the first token
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    c = None if not SWITCH else whole({"chat_template_kwargs": {"enable_thinking": False}}, max_tokens=40,
              response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    try:
        ok = isinstance(json.loads(c.message.content)["n"], int)
    except Exception:
        ok = False
    SWITCH and check("json_schema, thinking off: valid JSON content", ok and c.finish_reason == "stop", c.message.content)
    # a tool call after the reasoning
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    if XML:
        call = ('"<tool_call>\\n<function=get_weather>\\n<parameter=city>\\n" [A-Z] [a-z]{1,6} '
                '"\\n</parameter>\\n</function>\\n</tool_call>"')
    else:
        call = '"<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" [A-Z] [a-z]{1,6} "\\"}}\\n</tool_call>"'
    gt = 'root ::= ' + HEAD + '"Thinking " [a-z]{1,8} "\\n</think>\\n\\n" ' + call
    c = whole({"grammar": gt}, tools=tools, max_tokens=400)
    tc = c.message.tool_calls or []
    rc = ext(c.message, "reasoning_content")
    args = json.loads(tc[0].function.arguments) if tc else {}
    check("tool call after reasoning: whole", len(tc) == 1 and tc[0].function.name == "get_weather"
          and re.fullmatch(r"[A-Z][a-z]{1,6}", args.get("city", "")) and c.finish_reason == "tool_calls"
          and re.fullmatch(r"Thinking [a-z]{1,8}", rc or "") and not c.message.content, c.message)
    rs, cs, _, calls, fin = streamed({"grammar": gt}, tools=tools, max_tokens=400)
    check("tool call after reasoning: streamed", "".join(rs) == rc and not "".join(cs).strip()
          and list(calls) == [0] and calls[0]["name"] == "get_weather"
          and json.loads(calls[0]["args"]) == args and fin == "tool_calls", (rs, cs, calls, fin))
    # history: the reasoning given back
    hist = MSG + [{"role": "assistant", "content": "Answer 4.", "reasoning_content": "Thinking hard"},
                  {"role": "user", "content": "And 3 + 3?"}]
    c = whole({"grammar": G}, messages=hist)
    check("history with reasoning_content accepted", re.fullmatch(r"Answer [0-9]{1,3}\.", c.message.content or ""),
          c.message)
else:
    c = whole({"grammar": G})
    check("inline server: raw text in content", RAW.match(c.message.content or ""), c.message.content)
    check("inline server: no reasoning_content", not ext(c.message, "reasoning_content"), c.message)
    c = whole({"grammar": G, "reasoning_format": "separate"})
    check("inline server, separate on request", re.fullmatch(r"Answer [0-9]{1,3}\.", c.message.content or "")
          and re.fullmatch(r"Thinking [a-z]{1,8}", ext(c.message, "reasoning_content") or ""), c.message)
'''


def run_client(py, srv, tag, open_, inline=False, xml=False, switch=True, harmony=False, model="random.gguf",
               end_id=None):
    cfg = {"base": srv.base(), "model": model, "tag": tag, "open": open_, "inline": inline, "xml": xml,
           "switch": switch, "harmony": harmony, "end_id": end_id}
    run_script(py, CLIENT, cfg, 900)


def check_cli(rnd, tmp):
    """lamina run --chat: only the answer on stdout; the reasoning on stderr
    with --show-reasoning (not a terminal here: no ANSI codes)."""
    g = os.path.join(tmp, "think.gbnf")
    with open(g, "w") as f:
        f.write('root ::= "Thinking " [a-z]{1,8} "\\n</think>\\n\\n" "Answer " [0-9]{1,3} "."\n')
    base = [LAMINA, "run", "-m", rnd, "--chat", "--chat-template", "qwen3.5", "-p", "hi", "-n", "60", "--seed", "1",
            "--grammar", g]
    r = subprocess.run(base, capture_output=True, text=True, timeout=300)
    ok = r.returncode == 0 and re.fullmatch(r"Answer [0-9]{1,3}\.\n", r.stdout) and "Thinking" not in r.stderr
    result("run --chat: only the answer printed", ok, (r.stdout, r.stderr))
    r = subprocess.run(base + ["--show-reasoning"], capture_output=True, text=True, timeout=300)
    ok = (r.returncode == 0 and re.fullmatch(r"Answer [0-9]{1,3}\.\n", r.stdout)
          and re.match(r"Thinking [a-z]{1,8}\n", r.stderr) and "\x1b" not in r.stderr)
    result("run --chat --show-reasoning: the reasoning on stderr", ok, (r.stdout, r.stderr))
    h = os.path.join(tmp, "harmony.gbnf")
    with open(h, "w") as f:
        f.write('root ::= "<|channel|>analysis<|message|>Thinking " [a-z]{1,8} "<|end|><|start|>assistant'
                '<|channel|>final<|message|>Answer " [0-9]{1,3} "."\n')
    r = subprocess.run([LAMINA, "run", "-m", rnd, "--chat", "--chat-template", "gpt-oss", "-p", "hi", "-n", "200",
                        "--seed", "1", "--grammar", h, "--show-reasoning"], capture_output=True, text=True, timeout=300)
    ok = (r.returncode == 0 and re.fullmatch(r"Answer [0-9]{1,3}\.\n", r.stdout)
          and re.match(r"Thinking [a-z]{1,8}\n", r.stderr))
    result("run --chat, gpt-oss: the final channel printed, the analysis on stderr", ok, (r.stdout, r.stderr))


def main():
    py, why = client_python()
    if not py:
        skip("openai client checks", "could not install openai (%s)" % why, 20)
        return summary()
    servers = []
    tmp = tempfile.mkdtemp(prefix="lamina-reasoning-")
    try:
        rnd = os.path.join(tmp, "random.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "-o", rnd, "--layers", "2", "--embd", "64", "--heads", "4",
                            "--kv-heads", "2", "--ff", "128", "--ctx", "2048", "--vocab-from", MODEL, "--seed", "5"],
                           capture_output=True, text=True, timeout=300)
        result("mkmodel writes a random-weight model", r.returncode == 0, r.stderr)
        for fam, open_, xml in (("qwen3", False, False), ("qwen3.5", True, True), ("deepseek-r1", True, False)):
            srv = Server(rnd, "--chat-template", fam)
            servers.append((srv, fam))
            run_client(py, srv, fam, open_, xml=xml, switch=fam != "deepseek-r1")
        srv = Server(rnd, "--chat-template", "gpt-oss")
        servers.append((srv, "gpt-oss"))
        run_client(py, srv, "gpt-oss", False, harmony=True)
        # the harmony test vocabulary: its markers are tokens of their own
        hrm = os.path.join(tmp, "harmony.gguf")
        r = subprocess.run([LAMINA, "mkmodel", "-o", hrm, "--layers", "2", "--embd", "64", "--heads", "4",
                            "--kv-heads", "2", "--ff", "128", "--ctx", "2048", "--vocab-from",
                            "tests/data/vocab/ggml-vocab-harmony.gguf", "--seed", "5"],
                           capture_output=True, text=True, timeout=300)
        result("mkmodel writes a random-weight model of the harmony vocabulary", r.returncode == 0, r.stderr)
        srv = Server(hrm, "--chat-template", "gpt-oss")
        servers.append((srv, "gpt-oss, harmony vocabulary"))
        r = subprocess.run([LAMINA, "tokenize", "-m", hrm, "--ids"], input="<|end|>", capture_output=True,
                           text=True, timeout=60)
        end_id = int(r.stdout.split()[0]) if r.returncode == 0 and len(r.stdout.split()) == 1 else None
        result("<|end|> is one token of the harmony vocabulary", end_id is not None, (r.stdout, r.stderr))
        run_client(py, srv, "gpt-oss/harmony vocabulary", False, harmony=True, model="harmony.gguf", end_id=end_id)
        check_cli(rnd, tmp)
        srv = Server(rnd, "--chat-template", "qwen3.5", "--reasoning-format", "inline")
        servers.append((srv, "inline"))
        run_client(py, srv, "qwen3.5 inline", True, inline=True)
    except Exception:
        import traceback
        result("e2e_reasoning ran to the end", False, traceback.format_exc())
    finally:
        for srv, name in servers:
            srv.stop(name)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
