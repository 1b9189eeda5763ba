"""Importing recovery events from another instance's export (``import.jsonl``, ``import.csv``).

- ``formats``: reading records (lines, or CSV rows that may span lines) and
  turning them into events; the export format they mirror (pure);
- ``models``: ``ImportRecord``, one per source file (by SHA-256);
- ``operations``: the two durable operations.
"""
