"""What crosses the wire: envelopes and their codec, topic names, JSON schemas.

May import: `tables` (the records it carries) and `app.errors`.
"""
