"""Operating nodes: the HTTP edge and operator page, and the rebuild of the timer view.

May import: `app.node`, `app.timers`, `app.kafka`, `app.protocol`, `app.clients` (the timer
book's commands), `app.model`, `app.jobs` (the names of a job's schedule), `tables`.
"""
