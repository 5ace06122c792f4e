"""Cost-aware scaling policies (installed as `astraflow.policies`).

A leaf package like `astraflow.stores`: it must not import the runtime, torch,
modal or sky at module level. The scaling-policy API (observation → plan of
workers per pool), its cost model and simulator arrive with their own issue;
until then this package holds nothing.
"""
