"""Seeing a run: status, rollouts, metric sinks and a live dashboard, all from the store.

    store (any machine that can reach it: a run folder or s3://)
      ├─ metrics table ─┐
      ├─ traj_<policy> ─┼─► RunView.refresh()   one incremental read per table per refresh
      ├─ _progress/     │     ├─► status   (rich table, --json, --watch)
      ├─ weights/       ┘     ├─► dashboard (FastAPI + plotly.js shipped in the plotly wheel)
      └─ components.json       └─► (audit verdict on its own, slower cadence)
      metrics table ─► Follower (by commit version) ─► TensorBoard / W&B sinks
                                                       (the launcher, or `astraflow export`)
      traj_<policy> ─► inspect (filtered scan, decoded with the policy's codec)

Nothing here writes to the store or runs inside a trainer or worker process: a
broken viewer or sink can never slow down or stop training.
"""
