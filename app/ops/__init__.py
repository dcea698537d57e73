"""Operating nodes: the HTTP edge and operator page, and the rebuild of the timer view.

May import: `app.node`, `app.timers`, `app.kafka`, `app.protocol`, `app.clients` (the timer
book's commands), `app.model`, `app.jobs` and `app.service` (the jobs' commands, `job_api`),
`app.commands` (where an aggregate's record belongs, `misrouted`: the jobs' log is read as
the workers read it), `app.errors`, `app.log_limit`, `app.task_ends`, `tables`, and the
package's version (`app.__version__`).
"""
