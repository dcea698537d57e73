"""Libraries for other applications: the timer book (timers set and cancelled by command)
and the faust-streaming client (`pip install '.[faust]'` from a clone).

May import: `app.model`, `app.commands`, `app.protocol`, `app.kafka`, `app.node`, `tables`,
`app.errors`.
"""
