"""Test aids that ship with the package: the stand-in agent (a pi-like program with no LLM) and
the fake model (an OpenAI-compatible server real pi can talk to offline, docs/offline.md).

Programs of their own, like cli/: they print, read their argv and exit; below the programs
nothing imports them (the demo and ``pi-matrix fake-model`` run them).
"""
