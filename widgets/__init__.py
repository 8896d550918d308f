"""Panel components of the studio: each draws what the core (``studio``) reads, and nothing else.

Widgets never run a model, write SQL or import :mod:`studio.face` (which composes them). The
panels sit flat here, one tab or card each; ``widgets.base`` holds what they build on (session
state, background jobs, style, plots) and ``widgets.runtime`` how the served process runs pages.
"""
