"""A worker process: settings, its local data directory, its metrics, and the node that
owns partitions (restores them, runs their cycles and timers, lets them go).

May import: everything below it (`app.commands`, `app.timers`, `app.kafka`, `app.service`,
`app.model`, `app.protocol`, `tables`); never `app.ops` or `app.cli`.
"""

from app.node.node import Node, node_topics

__all__ = ["Node", "node_topics"]
