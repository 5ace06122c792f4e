"""One trainer process for the policies that share a base: one copy of it, an adapter each.

    SharedBase: base weights (once, frozen) + peft adapters {solver, verifier, …}
        AdapterTrainer(solver):   own optimizer (solver's factors), cursor, ledger
                                  steps, checkpoints, versions (adapters only)
        AdapterTrainer(verifier): …
    run_together: round-robin; each trainer steps when its table has a batch

Each `AdapterTrainer` is a `Trainer` in every respect but three: its model is its
adapter on the shared base (activated before each step), its optimizer holds only
that adapter's factors, and its checkpoints hold only those (not the base, not the
others' adapters). So the ledger, rollback, republish and audit stay per policy, as
with one process per policy; a restart of the process resumes each from its own
checkpoint. A policy at version 0 serves the base itself: its fresh adapters (B = 0)
are drawn as a lone LoRA trainer draws them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from astraflow import testing
from astraflow.context import RunContext
from astraflow.models import lora
from astraflow.models.hf import from_pretrained, save_policy
from astraflow.train.trainer import Trainer

log = logging.getLogger("astraflow.trainer")


class SharedBase:
    """One frozen base model and a named, trainable adapter per policy on it."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None  # the peft model, once a policy attached
        self.fingerprint: dict[str, str] | None = None

    def attach(self, policy: str, path: str | Path, spec) -> torch.nn.Module:
        """Add `policy`'s adapter: that of adapter version `path`, or fresh ones on a
        full version 0 (which must be the base already held). `spec`: its ModelSpec."""
        path = Path(path)
        base = lora.base_dir(path) if lora.is_adapter(path) else path
        fingerprint = lora.fingerprint(base)
        if self.fingerprint is None:
            self.fingerprint = fingerprint
            self.model = from_pretrained(base, dtype=spec.dtype, device="cpu",
                                         use_safetensors=True)
        elif fingerprint != self.fingerprint:
            raise ValueError(f"{policy}: its base {base} is not the base shared as "
                             f"{spec.shared_base!r} (its weights differ): policies sharing a "
                             f"base need the same version 0")
        assert self.model is not None
        if lora.is_peft(self.model) and policy in self.model.peft_config:
            raise ValueError(f"{policy} is attached to this base already")
        if lora.is_adapter(path):
            self.model = lora.load_trainable(self.model, path, spec.lora, name=policy)
        else:
            self.model = lora.wrap(self.model, spec.lora, source=path, name=policy)
        return self.model

    def activate(self, policy: str) -> None:
        """Make `policy`'s adapter the one that runs (and trains)."""
        assert self.model is not None
        self.model.set_adapter(policy)

    def params(self, policy: str) -> list[torch.nn.Parameter]:
        """`policy`'s adapter factors (what its optimizer steps)."""
        assert self.model is not None
        out = [p for n, p in self.model.named_parameters()
               if f".lora_A.{policy}." in n or f".lora_B.{policy}." in n]
        if not out:
            raise RuntimeError(f"no adapter {policy!r} on the shared base")
        return out

    def base_parameters(self) -> list[torch.nn.Parameter]:
        """The frozen base's parameters (every one not an adapter's): held once."""
        assert self.model is not None
        return [p for n, p in self.model.named_parameters() if ".lora_" not in n]


class AdapterState(torch.nn.Module):
    """What a checkpoint of one adapter on a shared base holds: its factors only,
    keyed without the adapter's name."""

    def __init__(self, model: torch.nn.Module, policy: str):
        super().__init__()
        self._model, self._policy = [model], policy  # a list: not a submodule

    def _named(self) -> dict[str, torch.Tensor]:
        return {k.replace(f".{self._policy}.", "."): v
                for k, v in lora.adapter_state(self._model[0], self._policy).items()}

    def state_dict(self, *args, **kwargs):  # type: ignore[override]
        return self._named()

    def parameters(self, recurse: bool = True):  # type: ignore[override]
        names = dict(self._model[0].named_parameters())
        return iter([names[k] for k in lora.adapter_state(self._model[0], self._policy)])

    @torch.no_grad()
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        own = self._named()
        if set(state_dict) != set(own):
            raise RuntimeError(f"checkpoint of adapter {self._policy}: keys differ from its "
                               f"adapter's ({sorted(set(state_dict) ^ set(own))[:4]})")
        for k, v in state_dict.items():
            own[k].copy_(v)
        return None


class AdapterTrainer(Trainer):
    """A policy's trainer whose model is its adapter on a `SharedBase`."""

    def __init__(self, ctx: RunContext, policy: str, base: SharedBase):
        self.base = base
        super().__init__(ctx, policy)
        if self.ranks.world > 1:
            raise ValueError("policies sharing a base train in one process (trainer.ranks: 1)")

    def _load(self, path) -> torch.nn.Module:
        return self.base.attach(self.policy, path, self.spec.model)

    def _trainable(self) -> list[torch.nn.Parameter]:
        return self.base.params(self.policy)

    def _state(self) -> torch.nn.Module:
        return AdapterState(self.base.model, self.policy)

    def _save(self, staging, state) -> None:
        save_policy(self.model, staging, source=self.carried, adapter=self.policy)

    def _optimize(self, batch):
        self.base.activate(self.policy)
        try:
            return super()._optimize(batch)
        finally:
            # No gradient of ours outlives the step: the next adapter's step clips the
            # norm of every gradient in the model, which must be its own alone.
            self.opt.zero_grad(set_to_none=True)


def trainers_for(ctx: RunContext, policies: list[str]) -> list[Trainer]:
    """The trainers of `policies`: those sharing a base (`model.shared_base`) on one
    copy of it per base, the others each on its own model."""
    bases: dict[str, SharedBase] = {}
    out: list[Trainer] = []
    for p in policies:
        group = ctx.flow.policy_spec(p).model.shared_base
        if group is None:
            out.append(Trainer(ctx, p))
        else:
            out.append(AdapterTrainer(ctx, p, bases.setdefault(group, SharedBase())))
    return out


def run_together(trainers: list[Trainer], *, max_steps: int, deadline: float | None = None,
                 should_stop=lambda: False) -> list[int]:
    """Train several policies in this process until each has `max_steps` steps, the
    deadline, or `should_stop()`: each steps whenever its table holds a batch, in turn;
    then each checkpoints. Returns each one's steps."""
    poll = trainers[0].ctx.flow.trainer.poll_interval_s
    for t in trainers:
        t.ledger.metrics_every_s = t.ctx.flow.store.metrics_every_s
        t.publisher.background = t.ctx.flow.mode != "sync"  # as Trainer.run does
    try:
        while not should_stop() and (deadline is None or time.time() <= deadline):
            due = [t for t in trainers if t.step < max_steps]
            if not due:
                break
            stepped = False
            for t in due:
                sl = t.poll()
                if sl is None:
                    if t.maybe_publish() is not None:  # its barrier opened meanwhile
                        t._write_progress()
                    continue
                res = t.train_on(sl)
                stepped = True
                testing.pause_at(t.policy, res.step)  # inert unless a test asks
                if res.step % 10 == 0:
                    log.info("%s step %d v%d reward %.3f used %d/%d", t.policy, res.step,
                             t.version, res.metrics["reward_mean"], res.rows_used, res.rows_read)
            if not stepped:
                for t in trainers:
                    t.ledger.flush_due()
                time.sleep(poll)
    finally:
        for t in trainers:
            t.ledger.metrics_every_s = 0.0
            t.publisher.background = False
            t.ledger.flush_metrics()
    for t in trainers:
        took = t.save_checkpoint()
        if took:
            log.info("checkpointed %s after step %d in %.2fs", t.policy, t.step - 1, took)
        t.publisher.wait()
        t.mirror.stop(timeout=10.0)
    return [t.step for t in trainers]
