"""Commands whose flags and set-up outgrow :mod:`exhume.cli` (``exhume train``); ``exhume audit``'s live with the audit."""
