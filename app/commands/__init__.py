"""The command path of one partition: commands (read from the topic or fired in-process)
decided into one transaction's records, aggregate state folded from the log, dead letters.

May import: `app.model`, `app.protocol`, `app.kafka` (records, the reader port, the topic
catalog), `tables`, `app.errors`.
"""
