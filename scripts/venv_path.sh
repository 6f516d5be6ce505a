#!/usr/bin/env bash
# Prints where the project's Python virtual environment lives: outside the clone, in a cache folder, so fresh
# clones and CI on the same machine reuse it (torch alone is gigabytes). MLA_VENV overrides.
echo "${MLA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mla-bisect/venv}"
