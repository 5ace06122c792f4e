"""Modal side: the deployed rollout app's class, looked up by name, and call cancels.

The app is `apps/rollout.py` in a checkout; it ships in the wheel too
(`astraflow/cloud/apps/rollout.py`), so an installed astraflow deploys it with
`modal deploy -m astraflow.cloud.apps.rollout`. Modal is imported only inside the functions that call it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from astraflow.cloud.jobs import MODAL_CLASS, LaunchError
from astraflow.cloud.skypilot import checkout


def app_file() -> Path:
    """The Modal rollout app to deploy: the checkout's `apps/rollout.py`, else the copy
    installed with the package."""
    root = checkout()
    if root is not None:
        return root / "apps" / "rollout.py"
    return Path(str(resources.files("astraflow.cloud").joinpath("apps", "rollout.py")))


def deploy_hint() -> str:
    """The command that deploys the app, as the user would type it."""
    root = checkout()
    return "modal deploy apps/rollout.py" if root else "modal deploy -m astraflow.cloud.apps.rollout"


def modal_class(app: str):
    """The deployed app's Rollout class, looked up before anything starts."""
    import modal

    cls = modal.Cls.from_name(app, MODAL_CLASS)
    try:
        cls.hydrate()
    except modal.exception.NotFoundError as err:
        raise LaunchError(f"Modal app {app!r} has no class {MODAL_CLASS!r}: deploy it first "
                          f"({deploy_hint()}) ({err})") from None
    except modal.exception.Error as err:  # no token, wrong workspace, ...
        raise LaunchError(f"Modal refused the lookup of {app}.{MODAL_CLASS}: {err} (modal token "
                          f"new / MODAL_TOKEN_ID sets the account)") from None
    return cls


def cancel_modal_call(call_id: str) -> None:
    """Cancel one call; one that already ended is fine (nothing to stop)."""
    import modal

    modal.FunctionCall.from_id(call_id).cancel()
