#!/usr/bin/env python3
"""lamina against llama.cpp on the Mixture-of-Experts files lamina mkmodel
builds (qwen3moe, qwen2moe, Mixtral-style llama, gpt-oss): the checks of
tests/e2e_arch.py, whose docstring says what they are."""
import sys

from e2e_arch import main  # noqa: E402 (tests/ is the script's folder)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["qwen3moe", "qwen2moe", "mixtral", "gpt-oss"]))
