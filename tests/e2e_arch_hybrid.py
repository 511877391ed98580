#!/usr/bin/env python3
"""lamina against llama.cpp on the hybrid files lamina mkmodel builds (qwen35,
qwen35moe, qwen3next: gated-DeltaNet linear-attention layers beside gated
full attention): the checks of tests/e2e_arch.py, whose docstring says what
they are."""
import sys

from e2e_arch import main  # noqa: E402 (tests/ is the script's folder)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["qwen35", "qwen35moe", "qwen3next"]))
