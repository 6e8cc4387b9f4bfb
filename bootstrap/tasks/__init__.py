"""One module per task family; ``bootstrap.build_collection`` turns every task defined in
a module here into a ``fab`` task. Each module holds its pure planners, its steps and its
tasks; the plumbing they share is in :mod:`bootstrap.fleet`.
"""
