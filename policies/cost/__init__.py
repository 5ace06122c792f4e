"""The cost-aware scaling policy: `CostAware` and its settings, `CostConfig`.

`config` (the typed settings), `economics` (dollars and GPU-hours per row, demand,
moves), `hedge` (a spot pool's share, growth and probing), `policy` (the plan).
"""

from astraflow.policies.cost.config import CostConfig
from astraflow.policies.cost.policy import CostAware

__all__ = ["CostAware", "CostConfig"]
