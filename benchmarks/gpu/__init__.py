"""The papers' settings on one GPU (``run.py``)."""
