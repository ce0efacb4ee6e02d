"""`decidealot evaluate`: labelled rows through any model as served, laya-evals' metrics, the
threshold a caller can act on, and a gate for CI (docs/evaluate.md).

`rows` reads the data, `answering` gets the answers (this process's service or a running
server, through the batch path), `metrics` computes laya-evals' numbers, `thresholds` the
risk-coverage tables, `gate` the limits, the baseline and the run identity, `command` runs it.
"""
