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

Templates in EXTERNAL are not kept in templates/: their text is read from a
directory of template files (llama.cpp's models/templates/, named by
--templates DIR or $LAMINA_CHAT_TEMPLATES), and their cases, CONVS and
their own (EXTRA), go to tools_golden_<id>.txt, in the same format, left as
it is when the directory is not given.

Run from the repository root with jinja2 installed (any 3.x):
  python3 tests/data/chat/make_tools_golden.py --templates ../llama.cpp/models/templates
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

OUT = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = [("qwen2.5-7b-instruct", "-", "<|im_end|>"),
             ("qwen3-0.6b", "-", "<|im_end|>"),
             ("mistral-7b-instruct-v0.3", "<s>", "</s>"),
             ("mistral-nemo-instruct-2407", "<s>", "</s>")]

# (id, file name in the template directory, bos, eos)
EXTERNAL = [("qwen3.5-4b", "Qwen3.5-4B.jinja", "-", "<|im_end|>"),
            ("gpt-oss-120b", "openai-gpt-oss-120b.jinja", "-", "<|return|>")]

# strftime_now(fmt) formats this day (tests/test_chat.c passes the same date).
FIXED_DATE = datetime.datetime(2025, 8, 5, 12, 0, 0)

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

# Conversations for one template only: Qwen3.5's XML calls write every
# argument as a parameter (strings raw, objects and arrays as JSON, other
# values as Python's str()), contents trimmed, reasoning after the last query.
XML_ARGS = ('{"location": "Paris", "days": 3, "ratio": 1.50, "big": 1e3, "tiny": 0.00001, "small": 0.0001, '
            '"neg": -0, "negf": -0.0, "exp": -1.5e-7, "e16": 1e16, "e15": 1E15, "long": 123456789012345678.0, '
            '"int": 12345678901234567890, "huge": 1e400, "flag": true, "off": false, "none": null, '
            '"longnum": 0.00000000000000000000000000000000000000000000000000000000000000000000000012345, '
            '"one": 1.0, "sci": 2.5E+3, '
            '"list": [1, "a", {"b": false}], "obj": {"k": "v\\n2", "n": []}, "text": "line one\\nline two\\n", '
            '"empty": "", "caf\\u00e9": "\\u65e5"}')
EXTRA = {"qwen3.5-4b": [
    ("xml_values", [WEATHER, TIME], [
        (S, "  You are a helpful assistant.\n", None, None),
        (U, "Check these.", None, None),
        (A, "<think>\nI should call it.\n</think>\n\nCalling now.", [call("c1", "get_weather", XML_ARGS)], None),
        (T, '  {"temperature": 18}  \n', None, "c1"),
        (A, "It is 18.", None, None),
        (U, " Thanks ", None, None)]),
    ("xml_after_query", [WEATHER], [
        (U, "Weather in Rome and Oslo?", None, None),
        (A, "<think>\nplan\n</think>\n\n", [call("c1", "get_weather", '{"location": "Rome"}'),
                                            call("c2", "get_weather", '{"location": "Oslo", "unit": "celsius"}')],
         None),
        (T, "sunny", None, "c1"),
        (T, "rain", None, "c2"),
        (U, "<tool_response>\nlate\n</tool_response>", None, None),
        (A, "no think, only text </think> kept?", [call("c3", "get_time", '{}')], None),
        (T, "12:00", None, "c3")]),
    ("xml_system_blank", [TIME], [
        (S, " \n ", None, None),
        (U, "Time?", None, None),
        (A, "   ", [call("c1", "get_time", '{"tz": "UTC"}')], None)]),
    ("xml_tool_first", [], [
        (T, "orphan", None, "c0"),
        (U, "q", None, None)]),
    ("xml_no_query", [TIME], [
        (S, "sys", None, None),
        (U, "<tool_response>\nx\n</tool_response>", None, None),
        (A, "a", None, None)]),
    ("xml_late_system", [], [
        (U, "q", None, None),
        (S, "late", None, None)]),
]}


# gpt-oss (harmony): tools rendered as a TypeScript-like namespace from
# their JSON Schemas, reasoning ("thinking") kept or dropped by position,
# one call per assistant message, results named by the last call.
SCHEMAS = {"type": "function", "function": {
    "name": "configure", "description": "Set options \u2014 caf\u00e9",
    "parameters": {"type": "object", "properties": {
        "name": {"type": "string", "description": "A name"},
        "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast", "description": "Speed"},
        "count": {"type": "integer", "default": 3},
        "ratio": {"type": "number", "default": 0.5},
        "flag": {"type": "boolean", "default": False},
        "label": {"type": "string", "default": "say \"hi\" \u00e9"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "points": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}}},
        "records": {"type": "array", "items": {"type": "object", "properties": {
            "key": {"type": "string"}, "value": {"type": "string"}, "extra": {"type": "boolean"}}}},
        "anything": {"type": "array"},
        "maybe": {"type": "string", "nullable": True},
        "either": {"type": ["string", "null"]},
        "single": {"type": ["integer"]},
        "choice": {"oneOf": [{"type": "string", "description": "by name", "default": "x"},
                             {"type": "integer"}], "default": "x"},
        "nested": {"type": "object", "required": ["inner"], "properties": {
            "inner": {"type": "object", "properties": {"deep": {"type": "boolean"}}},
            "level": {"type": "integer", "enum": [1, 2]}}},
        "blob": {"type": "object"},
        "free": {"description": "no type at all"},
        "objs": {"type": "array", "items": {"oneOf": [{"type": "object"}, {"type": "object"}]}}},
        "required": ["name", "grid"]}}}
NO_PARAMS = {"type": "function", "function": {"name": "ping", "description": "Ping"}}
EMPTY_PARAMS = {"type": "function", "function": {"name": "noop", "description": "Nothing",
                                                 "parameters": {"type": "object", "properties": {}}}}
# No description: jinja2 raises on "// " + undefined; llama.cpp's template
# engine joins an undefined value as "", and so does lamina. The case is
# rendered with description "" (the same text), SILENT_DESC below.
NO_DESC = {"type": "function", "function": {"name": "bare", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def think(m, text):
    """An assistant message tuple with reasoning (the template's thinking)."""
    return m + (text,)


HARMONY = [
    ("harmony_schemas", [SCHEMAS, NO_PARAMS, EMPTY_PARAMS, NO_DESC], [
        (S, "Use the tools.", None, None),
        (U, "Configure it.", None, None)]),
    ("harmony_reasoning", [], [
        (U, "What is 2+2?", None, None),
        think((A, "4", None, None), "Add them."),
        (U, "And 3+3?", None, None),
        think((A, "6", None, None), "Six, clearly.\n")]),
    ("harmony_reasoning_empty", [], [
        (U, "q", None, None),
        think((A, "a", None, None), "")]),
    ("harmony_calls", [WEATHER, TIME], [
        (U, "Weather in Rome, then the time?", None, None),
        think((A, "", [call("c1", "get_weather", '{"location": "Rome"}')], None), "Need the weather first."),
        (T, "sunny \"22\"\n", None, "c1"),
        (A, "Checking the time too.", [call("c2", "get_time", '{"tz": "Europe/Rome"}'),
                                       call("c3", "get_weather", '{"location": "Oslo"}')], None),
        (T, "14:05", None, "c2")]),
    ("harmony_calls_answered", [WEATHER], [
        (S, "Be brief.", None, None),
        (U, "Weather in Rome?", None, None),
        think((A, "", [call("c1", "get_weather", '{"location": "Rome", "unit": "celsius"}')], None), "Call it."),
        (T, "sunny", None, "c1"),
        think((A, "Sunny.", None, None), "It said sunny."),
        (U, "Thanks", None, None)]),
    ("harmony_both", [WEATHER], [
        (U, "q", None, None),
        think((A, "content", [call("c1", "get_weather", '{"location": "Rome"}')], None), "reasoning")]),
    ("harmony_tags", [], [
        (U, "q", None, None),
        (A, "<|channel|>final<|message|>x", None, None)]),
    ("harmony_tags_thinking", [], [
        (U, "q", None, None),
        think((A, "x", None, None), "a<|channel|>analysis<|message|>b")]),
    ("harmony_orphan_tool", [WEATHER], [
        (U, "q", None, None),
        (T, "result", None, "c0")]),
    ("harmony_tool_after_answer", [WEATHER], [
        (U, "q", None, None),
        (A, "", [call("c1", "get_weather", '{"location": "Rome"}')], None),
        (T, "sunny", None, "c1"),
        (A, "Sunny.", None, None),
        (T, "late", None, "c1")]),
    ("harmony_late_system", [], [
        (U, "q", None, None),
        (S, "late system", None, None),
        (A, "a", None, None),
        (U, "q2", None, None)]),
]
# kwargs of some cases: (name, reasoning_effort)
HARMONY_EFFORT = [("harmony_reasoning", "low"), ("harmony_calls", "high"), ("harmony_late_system", "medium")]
# ... and the template's model_identity: (name, text)
HARMONY_IDENTITY = [("harmony_reasoning_empty", "You are Lamina, a test model.\nSecond line \u00e9."),
                    ("harmony_late_system", "")]
EXTRA["gpt-oss-120b"] = HARMONY


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = FIXED_DATE.strftime
    env.filters["tojson"] = tojson
    return env


def hf_messages(msgs):
    out = []
    for role, content, calls, cid, *reasoning in msgs:
        m = {"role": role, "content": content}
        if reasoning:
            m["thinking"] = reasoning[0]
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


def silent_desc(tools):
    """The tools with an absent description given as "" (see NO_DESC)."""
    out = []
    for t in tools:
        t = json.loads(json.dumps(t))
        t["function"].setdefault("description", "")
        out.append(t)
    return out


def cases(env, text, tid, bos, eos, convs, efforts=(), identities=()):
    out = []
    tmpl = env.from_string(text)
    for name, tools, msgs in convs:
        for gen in (1, 0):
            kw = {}
            effort = dict(efforts).get(name)
            if effort:
                kw["reasoning_effort"] = effort
            identity = dict(identities).get(name)
            if identity is not None:
                kw["model_identity"] = identity
            out.append("case %s %d %s %s %s\n" % (tid, gen, name, bos, eos))
            if effort:
                out.append("effort %s\n" % effort)
            if identity is not None:
                out.append(blob("identity", identity))
            for t in tools:
                out.append(blob("tool", json.dumps(t, ensure_ascii=True, separators=(",", ":"))))
            for role, content, calls, cid, *reasoning in msgs:
                out.append(blob("msg " + role, content))
                for c in calls or []:
                    out.append(blob("call %s %s" % (c["id"], c["name"]), c["arguments"]))
                if cid is not None:
                    out.append("callid %s\n" % cid)
                if reasoning:
                    out.append(blob("think", reasoning[0]))
            if tid == "gpt-oss-120b":
                tools = silent_desc(tools)
            try:
                text = tmpl.render(messages=hf_messages(msgs), tools=tools or None, documents=None,
                                   add_generation_prompt=bool(gen), bos_token="" if bos == "-" else bos,
                                   eos_token=eos, **kw)
                out.append(blob("ok", text))
            except jinja2.exceptions.TemplateError as e:
                out.append("error\n%s\n" % " ".join(str(e).split()))
    return out


def write(path, parts):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(parts))


def main():
    ap = argparse.ArgumentParser(description="write tests/data/chat/tools_golden*.txt")
    ap.add_argument("--templates", default=os.environ.get("LAMINA_CHAT_TEMPLATES"),
                    help="directory holding the EXTERNAL templates (llama.cpp's models/templates/)")
    tdir = ap.parse_args().templates
    env = environment()
    out = ["# Written by make_tools_golden.py (jinja2 %s).\n" % jinja2.__version__]
    for tid, bos, eos in TEMPLATES:
        with open(os.path.join(OUT, "templates", tid + ".jinja"), encoding="utf-8") as f:
            out += cases(env, f.read(), tid, bos, eos, CONVS + EXTRA.get(tid, []))
    write(os.path.join(OUT, "tools_golden.txt"), out)
    for tid, fname, bos, eos in EXTERNAL:
        path = os.path.join(tdir, fname) if tdir else None
        if not path or not os.path.exists(path):
            print(f"{tid}: {fname} not found (--templates DIR): tools_golden_{tid}.txt left as it is", file=sys.stderr)
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        ext = ["# Written by make_tools_golden.py from %s (jinja2 %s).\n" % (fname, jinja2.__version__)]
        effort = HARMONY_EFFORT if tid == "gpt-oss-120b" else ()
        identity = HARMONY_IDENTITY if tid == "gpt-oss-120b" else ()
        write(os.path.join(OUT, "tools_golden_%s.txt" % tid), ext + cases(env, text, tid, bos, eos,
                                                                          CONVS + EXTRA.get(tid, []), effort,
                                                                          identity))


if __name__ == "__main__":
    main()
