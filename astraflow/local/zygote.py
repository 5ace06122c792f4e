"""The fork server behind `astraflow zygote`: import torch, transformers and lancedb once,
then fork one ready component per request, so a restart costs a fork, not seconds of imports.

Protocol (JSON lines on stdin/stdout): the supervisor writes {argv, env, log}; the server
answers {"ready": true} once, {"pid": N} per fork and {"exit": N, "code": C} whenever a
child exits (C < 0: killed by signal -C). The client side is `supervise.Zygote`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import warnings
from collections.abc import Callable


def _say(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def serve(run: Callable[[list[str]], object]) -> None:
    """Serve forks until stdin closes; each child runs `run(argv)` (the CLI) and exits."""
    import lancedb  # noqa: F401
    import torch  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401

    import astraflow.rollout.worker  # noqa: F401
    import astraflow.train.trainer  # noqa: F401

    # lancedb resets its async runtime in a forked child and warns that an operation
    # in flight at fork time could deadlock; the zygote never runs one, so none is.
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental")

    _say({"ready": True})
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        for pid in list(children):  # report exits (reaping keeps no zombies)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if not readable:
            continue
        line = sys.stdin.readline()
        if not line:  # the supervisor is gone: its components are stopped by pid, not by us
            return
        job = json.loads(line)
        pid = os.fork()
        if pid:
            children.add(pid)
            _say({"pid": pid})
            continue
        _child(job, run)


def _child(job: dict, run: Callable[[list[str]], object]) -> None:
    """In the forked child: a new session (stopped by process group), its own log, the
    job's env; run the command and leave with its exit code, never returning."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ.update(job["env"])
        run(job["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report, then leave with the failure code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
