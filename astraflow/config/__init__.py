"""The flow schema: what a flow YAML may say, checked before anything starts.

One module per subject: model, algorithm (and stages), workload (workflow, env),
components (rollout, trainer, stop), store, cloud (`launch:`); flow.py holds the root
FlowSpec, loader.py reads a file (`--set` overrides, error hints). Names of stages,
workflows and envs are checked through astraflow.registry, without importing the runtime.
"""
