"""Rows in SkyRL's dataset format for examples/skyrl-gym.yaml: two-operand word
problems whose answer the model ends with `#### N`, graded by skyrl-gym's own
`gsm8k_multi_turn` env (a right answer ends the episode; a well-formatted wrong one
earns a small format reward and a request to try again). Generated from a seed, so no
file is shipped and every process builds the same rows.
"""

from __future__ import annotations

import random

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana"]
THINGS = ["apples", "stamps", "marbles", "books", "shells", "coins"]


def rows(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        who, what = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        if rng.random() < 0.5:
            q, ans = f"{who} has {a} {what} and buys {b} more. How many {what} now?", a + b
        else:
            a += b
            q, ans = f"{who} has {a} {what} and gives away {b}. How many {what} are left?", a - b
        out.append({
            "prompt": [{"role": "user", "content": f"{q} End your reply with '#### ' and "
                                                   "the number."}],
            "env_class": "gsm8k_multi_turn",
            "reward_spec": {"method": "rule", "ground_truth": str(ans)},
            "extra_info": {"index": i, "max_turns": 2},
        })
    return out
