#!/usr/bin/env python3
"""
make_tools_golden.py - writes tests/data/chat/tools_golden.txt: conversations
with tools (OpenAI's function tools, assistant tool calls, tool results)
rendered with jinja2 by the real templates of the models whose tool format
lamina reproduces (Qwen2.5-Instruct, Mistral-7B-Instruct-v0.3,
Mistral-Nemo-Instruct-2407; templates/<id>.jinja), the way transformers'
apply_chat_template renders them: its jinja2 environment and its tojson
filter (json.dumps, ensure_ascii=False, keys in their order), the tools
passed as `tools`, tool-call arguments passed as objects (what vLLM and
llama.cpp make of OpenAI's JSON-string arguments). tests/test_chat.c renders
the same conversations with chat_render_tools and compares byte for byte.

Format, one case after another:
  case <template id> <gen 0/1> <name> <bos> <eos>   ("-": none)
  tool <nbytes>             then the tool's JSON text (as a client sends it)
  msg <role> <nbytes>       then the content
  call <id> <name> <nbytes> then the arguments' JSON text (the last msg's)
  callid <id>               the last msg (a tool result) answers call <id>
  ok <nbytes>               then the rendered text
  error                     then the template's message
each text followed by one newline.

Run from the repository root with jinja2 installed (any 3.x):
  python3 tests/data/chat/make_tools_golden.py
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

OUT = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = [("qwen2.5-7b-instruct", "-", "<|im_end|>"),
             ("qwen3-0.6b", "-", "<|im_end|>"),
             ("mistral-7b-instruct-v0.3", "<s>", "</s>"),
             ("mistral-nemo-instruct-2407", "<s>", "</s>")]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time \"now\" in a zone \u2014 caf\u00e9\nsecond line",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}, "n": {"type": "integer", "minimum": -5}},
                   "required": []}}}

S, U, A, T = "system", "user", "assistant", "tool"


def call(cid, name, args):
    return {"id": cid, "name": name, "arguments": args}


CONVS = [
    ("round_trip", [WEATHER, TIME], [
        (S, "You are a helpful assistant.", None, None),
        (U, "What is the weather in Paris?", None, None),
        (A, "", [call("abc123XYZ", "get_weather", '{"location": "Paris", "unit": "celsius"}')], None),
        (T, '{"temperature": 18, "sky": "clear"}', None, "abc123XYZ"),
        (A, "It is 18 degrees and clear in Paris.", None, None),
        (U, "And the time there?", None, None)]),
    ("parallel_no_system", [WEATHER, TIME], [
        (U, "Weather and time in Rome?", None, None),
        (A, "Let me check both.", [call("call00001", "get_weather", '{"location":"Rome"}'),
                                   call("call00002", "get_time", '{ "tz" : "Europe/Rome", "n": [1, 2.5, -3, true, null, {}] }')], None),
        (T, "sunny", None, "call00001"),
        (T, "14:05", None, "call00002")]),
    ("escapes", [TIME], [
        (U, "Caf\u00e9 \"time\"?", None, None),
        (A, "", [call("esc000001", "get_time", '{"tz": "caf\\u00e9 \\/ \\"q\\" \\n \\ud83d\\ude00", "x": "\u65e5\u672c"}')], None),
        (T, "ok", None, "esc000001"),
        (A, "Done.", None, None),
        (U, "Thanks", None, None)]),
    ("results_without_tools", [], [
        (U, "Call it.", None, None),
        (A, "", [call("nolist001", "get_time", '{}')], None),
        (T, "12:00", None, "nolist001")]),
    ("only_tools_list", [WEATHER], [
        (S, "Be brief.", None, None),
        (U, "Hi", None, None)]),
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = tojson
    return env


def hf_messages(msgs):
    out = []
    for role, content, calls, cid in msgs:
        m = {"role": role, "content": content}
        if calls:
            m["tool_calls"] = [{"id": c["id"], "type": "function",
                                "function": {"name": c["name"], "arguments": json.loads(c["arguments"])}}
                               for c in calls]
        if cid is not None:
            m["tool_call_id"] = cid
        out.append(m)
    return out


def blob(head, text):
    return "%s %d\n%s\n" % (head, len(text.encode("utf-8")), text)


def main():
    env = environment()
    out = ["# Written by make_tools_golden.py (jinja2 %s).\n" % jinja2.__version__]
    for tid, bos, eos in TEMPLATES:
        with open(os.path.join(OUT, "templates", tid + ".jinja"), encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        for name, tools, msgs in CONVS:
            for gen in (1, 0):
                out.append("case %s %d %s %s %s\n" % (tid, gen, name, bos, eos))
                for t in tools:
                    out.append(blob("tool", json.dumps(t, ensure_ascii=True, separators=(",", ":"))))
                for role, content, calls, cid in msgs:
                    out.append(blob("msg " + role, content))
                    for c in calls or []:
                        out.append(blob("call %s %s" % (c["id"], c["name"]), c["arguments"]))
                    if cid is not None:
                        out.append("callid %s\n" % cid)
                try:
                    text = tmpl.render(messages=hf_messages(msgs), tools=tools or None, documents=None,
                                       add_generation_prompt=bool(gen), bos_token="" if bos == "-" else bos,
                                       eos_token=eos)
                    out.append(blob("ok", text))
                except jinja2.exceptions.TemplateError as e:
                    out.append("error\n%s\n" % " ".join(str(e).split()))
    with open(os.path.join(OUT, "tools_golden.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(out))


if __name__ == "__main__":
    main()
