"""The aggregate model a service declares: aggregate types, their commands' decisions and
events' folds (pure: no I/O).

May import: `app.protocol`, `tables`, `app.errors`.
"""
