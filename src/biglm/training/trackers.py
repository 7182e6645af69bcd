"""The experiment trackers a run reports to (``--report_to``, with the names and meanings of Hugging Face
Trainer's ``report_to``): TensorBoard, Weights & Biases and trackio.

Every tracker gets the same scalars, the ones metrics.jsonl holds (``KIND/FIELD`` at the record's step: ``train/loss``,
``log/lr``, ``val/val_loss``...), the run's configuration, and the run directory's name as the run's name. A resume
continues the tracker's run: W&B's run id and trackio's project and run name are kept in ``OUT/trackers.json``, so
the same run directory always reports to the same tracker run and a new directory never joins another's. W&B runs
offline when no account is configured (``OUT/wandb``; ``wandb sync`` uploads it later); trackio logs to its local
database (``$TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``) unless its own variables name a Space.

A resumed run never sends a tracker a step twice: TensorBoard drops the steps past the resumed one (``purge_step``);
W&B and trackio cannot take a step back (W&B refuses a smaller step, trackio shows both), so the scalars an earlier
attempt sent past the resumed step (the records the resume drops from metrics.jsonl) are not sent to their resumed
runs again: they already hold them, with the same values (an exact resume).

A tracker never stops training: a missing package, or any error of a tracker (at start, at a log, at the end), is
one line on the console, and the run goes on without that tracker.
"""

from __future__ import annotations

import importlib.util
import json
import netrc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

TRACKERS = ("tensorboard", "wandb", "trackio")
"""the trackers ``--report_to`` names (besides ``all``: every one installed, and ``none``)"""
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
STATE_FILE = "trackers.json"
DEFAULT_PROJECT = "biglm"


def check_report_to(names: Sequence[str]) -> str | None:
    """Why ``names`` (a ``--report_to`` list) is refused, or None."""
    special = [n for n in names if n in ("all", "none")]
    if special and len(set(names)) > 1:
        return (f"--report_to {','.join(names)}: {special[0]!r} stands alone (all: every tracker installed; none: "
                f"no tracker); or name trackers: {','.join(TRACKERS)}")
    return None


def resolve_report_to(names: Sequence[str]) -> list[str]:
    """The trackers ``names`` asks for: ``all`` is every tracker whose package is installed, ``none`` (or nothing)
    is none; repeats are dropped."""
    if "none" in names:
        return []
    if "all" in names:
        return [n for n in TRACKERS if importlib.util.find_spec(PACKAGES[n]) is not None]
    return list(dict.fromkeys(names))


class Tracker:
    """One tracker's run: ``log`` scalars at a step, ``close`` at the end."""

    name: str
    purges_on_resume = False
    """whether a resumed run drops what was logged past the resumed step itself (else `Trackers` skips it)"""

    def log(self, scalars: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    purges_on_resume = True

    def __init__(self, out: Path, *, start_step: int, **_: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # the steps an earlier attempt logged past the resumed step are logged again: drop them
        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


def wandb_has_account() -> bool:
    """Whether W&B finds credentials (an API key in the environment or `wandb login`'s netrc entry); without them
    wandb.init would prompt, or fail."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbTracker(Tracker):
    name = "wandb"

    def __init__(self, out: Path, *, run_name: str, config: dict[str, Any], project: str, state: dict[str, Any],
                 echo: Callable[[str], None], **_: Any) -> None:
        import wandb

        mode = None
        if not os.environ.get("WANDB_MODE") and not wandb_has_account():
            mode = "offline"
            echo(f"[biglm] W&B: no account configured (WANDB_API_KEY or `wandb login`): logging offline to "
                 f"{out / 'wandb'}; `wandb sync {out / 'wandb'}/offline-run-*` uploads it later")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", project), name=run_name, dir=str(out),
                              config=config, id=state.get("id"), resume="allow", mode=mode)
        state["id"] = self.run.id

    def log(self, scalars: dict[str, float], step: int) -> None:
        # W&B's history is append-only: what an earlier attempt logged past the resumed step is never sent again
        # (`Trackers.log`)
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self, out: Path, *, run_name: str, config: dict[str, Any], project: str, state: dict[str, Any],
                 **_: Any) -> None:
        import trackio

        # a run directory reports to the trackio run it started (by project and name); a new one never joins another
        project, run_name = state.get("project", project), state.get("name", run_name)
        self.run = trackio.init(project=project, name=run_name, config=config, embed=False,
                                resume="allow" if state else "never")
        state.update(project=project, name=self.run.name, id=self.run.id)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


KINDS: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker,
                                   "trackio": TrackioTracker}


class Trackers:
    """The trackers of one run (main rank only). ``names`` are resolved `--report_to` values; ``config`` is the
    run's configuration as plain data; ``start_step`` the step the run (re)starts from; ``already_sent`` the
    (scalar, step) pairs an earlier attempt logged past it, which a resumed tracker run that cannot purge them is
    not sent again."""

    def __init__(self, out: Path, names: Sequence[str], *, config: dict[str, Any], start_step: int = 0,
                 project: str = DEFAULT_PROJECT, echo: Callable[[str], None] = print,
                 already_sent: set[tuple[str, int]] | None = None) -> None:
        self.out, self.echo = Path(out), echo
        self.active: list[Tracker] = []
        self.already_sent = already_sent or set()
        self._resumed: set[str] = set()  # trackers continuing a run an earlier attempt logged to
        if not names:
            return
        state_path = self.out / STATE_FILE
        try:
            saved = json.loads(state_path.read_text()) if state_path.is_file() else {}
        except (OSError, ValueError):
            saved = {}
        for name in names:
            if importlib.util.find_spec(PACKAGES[name]) is None:
                echo(f"[biglm] --report_to {name}: the {PACKAGES[name]} package is not installed (pip install "
                     f"'biglm[trackers]'); training goes on without it")
                continue
            state = dict(saved.get(name, {}))
            if state:
                self._resumed.add(name)
            try:
                tracker = KINDS[name](self.out, run_name=self.out.resolve().name, config=config, project=project,
                                      start_step=start_step, state=state, echo=echo)
            except Exception as e:  # noqa: BLE001 - a tracker never stops training
                self._failed(name, "could not start", e)
                continue
            self.active.append(tracker)
            if state:
                saved[name] = state
        if saved:
            tmp = state_path.with_name(STATE_FILE + ".tmp")
            tmp.write_text(json.dumps(saved, indent=2))
            os.replace(tmp, state_path)

    def _failed(self, name: str, what: str, e: BaseException) -> None:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        self.echo(f"[biglm] --report_to {name}: {what} ({type(e).__name__}{': ' + first if first else ''}); "
                  "training goes on without it")

    def log(self, scalars: dict[str, float], step: int) -> None:
        if not scalars:
            return
        for tracker in list(self.active):
            sent = self.already_sent if tracker.name in self._resumed and not tracker.purges_on_resume else ()
            new = {k: v for k, v in scalars.items() if (k, step) not in sent} if sent else scalars
            if not new:
                continue
            try:
                tracker.log(new, step)
            except Exception as e:  # noqa: BLE001
                self.active.remove(tracker)
                self._failed(tracker.name, f"logging failed at step {step}", e)
                _close_quietly(tracker)

    def close(self) -> None:
        for tracker in self.active:
            try:
                tracker.close()
            except Exception as e:  # noqa: BLE001
                self._failed(tracker.name, "could not finish its run", e)
        self.active = []


def _close_quietly(tracker: Tracker) -> None:
    try:
        tracker.close()
    except Exception:  # noqa: BLE001 - already reported as failed
        pass


__all__ = ["TRACKERS", "Trackers", "check_report_to", "resolve_report_to"]
