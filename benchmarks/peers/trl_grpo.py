"""TRL's GRPOTrainer on a flow's workload, set up as AstraFlow's flow is, timed the same way.

One optimiser step per generation batch: `prompts_per_batch` prompts × `num_generations`
= `samples_per_prompt` completions (per_device_train_batch_size = their product,
gradient accumulation 1, one iteration per batch), AdamW with the flow's lr, betas,
weight decay and gradient clip at a constant lr, beta = 0 (no KL, no reference model),
the flow's temperature with top-k/top-p off, `max_completion_length` = the flow's
max_new_tokens, fp32 on the CPU. TRL's own defaults that differ from the flow are set
to the flow's (gradient checkpointing off, bf16 off, constant lr); its loss is its
default (`dapo`, group-scaled advantages, clip ε 0.2). The prompts are the flow's
training draws as chat messages; the reward is the flow's env reward. The clock starts
when `train()` is called (the model is loaded before) and stops while a callback has
the shared evaluator score the weights after every step.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from astraflow.config.flow import FlowSpec
from astraflow.workflows.workload import make_env


def grpo_config(flow: FlowSpec, out_dir: Path, seed: int, max_steps: int):
    from trl import GRPOConfig

    ro, algo = flow.rollout, flow.policy.algorithm
    return GRPOConfig(
        output_dir=str(out_dir), seed=seed, data_seed=seed,
        per_device_train_batch_size=ro.prompts_per_batch * ro.samples_per_prompt,
        gradient_accumulation_steps=1, num_generations=ro.samples_per_prompt,
        num_iterations=1, max_steps=max_steps,
        temperature=ro.temperature, top_k=0, top_p=1.0,
        max_completion_length=ro.max_new_tokens,
        learning_rate=algo.lr, adam_beta1=algo.betas[0], adam_beta2=algo.betas[1],
        weight_decay=algo.weight_decay, max_grad_norm=algo.grad_clip,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        model_init_kwargs={"dtype": "float32"},
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0,
    )


def settings(flow: FlowSpec, cfg, threads: int) -> dict[str, object]:
    """TRL's side of the settings table, named as `flow_settings` names AstraFlow's."""
    return {
        "model": Path(flow.policy.model.path).name,
        "prompts per step": cfg.per_device_train_batch_size // cfg.num_generations,
        "samples per prompt": cfg.num_generations,
        "temperature": cfg.temperature,
        "top-k / top-p": f"{cfg.top_k or 'off'} / {cfg.top_p}",
        "max new tokens": cfg.max_completion_length,
        "lr": cfg.learning_rate,
        "betas": (cfg.adam_beta1, cfg.adam_beta2),
        "weight decay": cfg.weight_decay,
        "grad clip": cfg.max_grad_norm,
        "lr schedule": str(cfg.lr_scheduler_type).rsplit(".", 1)[-1].lower(),
        "entropy floor": "none",
        "KL coef": cfg.beta,
        "clip ε": cfg.epsilon,
        "dtype": "float32",
        "CPU threads": threads,
        "loss": f"TRL {cfg.loss_type} (group-scaled advantages, zero-variance groups kept)",
    }


def flow_settings(flow: FlowSpec, threads: str) -> dict[str, object]:
    """AstraFlow's side of the settings table."""
    ro, algo = flow.rollout, flow.policy.algorithm
    return {
        "model": Path(flow.policy.model.path).name,
        "prompts per step": ro.prompts_per_batch,
        "samples per prompt": ro.samples_per_prompt,
        "temperature": ro.temperature,
        "top-k / top-p": "off / 1.0",
        "max new tokens": ro.max_new_tokens,
        "lr": algo.lr,
        "betas": tuple(algo.betas),
        "weight decay": algo.weight_decay,
        "grad clip": algo.grad_clip,
        "lr schedule": (f"cosine to {algo.lr_min_ratio:g}x over " + (
            f"{algo.lr_decay_steps} updates" if algo.lr_decay_steps is not None else
            f"the run's budget ({flow.stop.max_steps} steps or {flow.stop.max_minutes:g} min)")
            if algo.lr_schedule == "cosine" else algo.lr_schedule),
        "entropy floor": (
            f"{algo.entropy_floor:g} nats/token (weight {algo.entropy_coef:g})"
            if algo.entropy_floor is not None else
            f"{algo.entropy_floor_of_v0:g} of version 0's entropy (weight {algo.entropy_coef:g})"
            if algo.entropy_floor_of_v0 is not None else "none"),
        "KL coef": algo.kl_coef,
        "clip ε": algo.clip_eps,
        "dtype": "float32",
        "CPU threads": threads,
        "loss": f"AstraFlow {algo.objective} (group-normalised advantages, "
                f"zero-variance groups skipped)",
    }


def run_trl(flow: FlowSpec, evaluator, *, seed: int, minutes: float, threads: int,
            out_dir: Path, console) -> dict:
    """Train for `minutes` on the clock; returns the curve (version 0 first), the clock's
    seconds, the steps, the start-up (building the trainer: model load), its settings and
    its per-step statistics."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from astraflow.envs.math import Task

    torch.set_num_threads(threads)
    env = make_env(flow)
    rng = random.Random(seed)
    n_prompts = flow.rollout.prompts_per_batch
    max_steps = 10_000  # the clock ends the run; the lr is constant, so this changes nothing
    tasks = [env.sample(rng) for _ in range(max_steps * n_prompts)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}],
                               "task_id": t.task_id, "answer": t.answer} for t in tasks])

    def reward(prompts, completions, task_id, answer, **_):
        return [env.reward(Task(i, "", a), c[-1]["content"])
                for c, i, a in zip(completions, task_id, answer, strict=True)]

    cfg = grpo_config(flow, out_dir, seed, max_steps)
    t_build = time.perf_counter()
    trainer = GRPOTrainer(model=str(flow.policy.model.path), reward_funcs=reward, args=cfg,
                          train_dataset=data)
    startup = time.perf_counter() - t_build
    acc0 = evaluator.model(trainer.model)
    curve = [(0.0, 0, acc0)]
    console.print(f"TRL: start-up (trainer and model) {startup:.1f}s; step 0 held-out {acc0:.1%}")

    class Clock(TrainerCallback):
        def __init__(self):
            self.start = self.paused = 0.0

        def now(self) -> float:
            return time.perf_counter() - self.start - self.paused

        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            t = self.now()
            p0 = time.perf_counter()  # the clock stops while the step's weights are scored
            acc = evaluator.model(trainer.model)
            trainer.model.train()
            curve.append((t, state.global_step, acc))
            console.print(f"  TRL step {state.global_step:3d} at {t:6.1f}s: held-out {acc:.1%}")
            if t >= minutes * 60:
                control.should_training_stop = True
            self.paused += time.perf_counter() - p0

    clock = Clock()
    trainer.add_callback(clock)
    trainer.train()
    stats = [{k: v for k, v in h.items() if isinstance(v, int | float)}
             for h in trainer.state.log_history if "loss" in h or "reward" in h]
    return {"curve": curve, "train_s": curve[-1][0], "steps": len(curve) - 1,
            "samples": (len(curve) - 1) * cfg.per_device_train_batch_size,
            "startup_s": startup, "settings": settings(flow, cfg, threads), "stats": stats}
