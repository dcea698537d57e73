"""Timers: the table kept from the log (`subscription`) and restored from its changelog
(`restore`), firing (`runner`), sending commands (`sender`), operators' retry/skip
(`operator`) and the failure ledger (`ledger`). The changelog's rows are written in each
partition's one transaction, which is the node's (`app.node.partition_transaction`).

May import: `app.protocol`, `app.kafka`, `tables`, `app.errors`, `app.log_limit`,
`app.backoff`.
"""
