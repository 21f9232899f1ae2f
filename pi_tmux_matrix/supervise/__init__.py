"""Supervision: the agent host, worker wind-down and adoption, master activation."""
