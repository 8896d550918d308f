"""Panel components of the studio: each draws what the core (``studio``) reads, and nothing else.

Widgets never run a model, write SQL or import :mod:`studio.face` (which composes them).
"""
