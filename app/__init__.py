"""Switchboard: one in-process vLLM engine served over OpenAI, GraphPipe, Evergreen and
Salience at once."""

__version__ = "0.1.0"
