"""Timers: the table kept from the log (`subscription`), its changelog transaction
(`changelog`), firing (`runner`), sending commands (`sender`), operators' retry/skip
(`operator`) and the failure ledger (`ledger`).

May import: `app.protocol`, `app.kafka`, `tables`, `app.errors`.
"""
