"""The fault, load and exactness suite (issue 6): scenarios that break real Redis processes
under load from several client processes, and report figures.

``scenarios`` modules each return ``Row``s (fault | what was checked | figure | pass); the quick
subset runs them with short durations under pytest (``test_quick.py``), and
``./scripts/reliability`` runs the full set and writes ``docs/reliability.md``.
"""
