"""A worker process: settings, its local data directory, its metrics, and the node that owns
partitions: one task per partition given to it (`partition_task`, its states in
`task_state`, what the tasks share in `task_shared`, its close run once in its own asyncio
task in `shielded_close`, its timer firing started and ended in `partition_firing`, and
what a failure of it lets go in `partition_failure`), which takes the partition
(`partition_take`: restores it), runs its cycles (on its own input each take,
`partition_input`; their logic, shared, in `cycles`, what they do to the timer table in
`cycle_timers`) and timers, and lets it go; the node
manages them (`node`; `partition_tasks` creates and closes them as the group gives and takes
their partitions, `partition_release` lets a closing task's partition go within one
deadline, `commits` schedules the tasks' commits, each task's own in `partition_commits`).
Everything of a partition commits in its one Kafka transaction of each type, its task's
(`partition_transaction`: timer rows, the command path's records, every offset), fencing its
previous owner; each type's `type_transactions` opens them and routes its timer store's rows
to them.

May import: everything below it (`app.commands`, `app.timers`, `app.kafka`, `app.service`,
`app.model`, `app.protocol`, `tables`, `app.errors`, `app.task_ends`, `app.backoff`,
`app.log_limit`) and the package's version (`app.__version__`); never `app.ops` or
`app.cli`.
"""

from app.node.node import Node, node_topics

__all__ = ["Node", "node_topics"]
