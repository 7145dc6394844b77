"""The pure decision core: model, predicates, scheduling simulation, scorers and planners.

Nothing in this package performs I/O, reads a clock or imports an SDK; import-linter enforces it.
"""
