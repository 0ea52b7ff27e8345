"""Hooks that feed the Recorder: L0 cell hooks (cell.py), L1 API wrappers (api.py)."""
