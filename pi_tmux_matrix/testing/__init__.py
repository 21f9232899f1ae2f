"""Test aids that ship with the package: the stand-in agent (a pi-like program with no LLM).

A program of its own, like cli/: it prints, reads its argv and exits; nothing else imports it.
"""
