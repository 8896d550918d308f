"""Rollout Studio core: data model, store, tasks, rewards, advantages."""
__version__ = "0.1.0"
