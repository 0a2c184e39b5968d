"""Lesson 10: the OpenAI-compatible server (``python -m minisgl``): an API process, a tokenizer
worker and the scheduler, talking over ZMQ in msgpack. Start with :mod:`minisgl.server.launcher`."""

__lesson__ = 10
