"""Where and how many replicas run on a Ray cluster: `ClusterOptions`, the one owner of the Ray options.

Each field is declared once (`bart_opt.surfaces.surfaced`) and every surface derives from it:
the command line (`add_cli_args`: ``--ray``, ``--replicas``, ``--gpus-per-replica``,
``--threads-per-replica``; `from_cli_args`), the service's settings (``BART_OPT_RAY_<FIELD>``,
`app.settings.Settings.cluster_options`) and the pool itself (`bart_opt.distributed.ReplicaPool`).
``address`` turns Ray on: where a surface leaves it unset (no ``--ray``, no ``BART_OPT_RAY_ADDRESS``)
there is no cluster, and Ray is not imported. This module imports no Ray.
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass, fields

from bart_opt.surfaces import check_bounds, surfaced

LOCAL = "local"  # the address that starts a Ray instance on this machine


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how many replicas run (each field's help says what it is)."""

    address: str = surfaced(
        LOCAL, "the Ray cluster that runs replicas of the model: 'local' (a bare --ray) starts a Ray instance here, "
        "'auto' joins the cluster this node joined with `ray start`, HOST:PORT the cluster whose head is there; "
        "unset: no cluster (the service runs its jobs on its own device thread) and Ray is not imported",
        setting="ray_address", flag="--ray", switch=True)
    replicas: int | None = surfaced(None, "model replicas (default: as many as the cluster holds)",
                                    setting="ray_replicas", flag="--replicas", ge=1)
    gpus_per_replica: float = surfaced(0.0, "GPUs of each replica (0: it runs on the CPU; 0.5: two share a GPU)",
                                       setting="ray_gpus_per_replica", flag="--gpus-per-replica", finite=True, ge=0)
    threads_per_replica: int = surfaced(1, "torch threads of each replica, and the CPUs it asks Ray for",
                                        setting="ray_threads_per_replica", flag="--threads-per-replica", ge=1)
    start_timeout_s: float = surfaced(600.0, "seconds to wait for a node with room for one replica before the run "
                                             "fails", setting="ray_start_timeout_s", gt=0)
    stall_timeout_s: float = surfaced(1800.0, "seconds the replicas may make no progress (model loading included) "
                                              "before the run fails", setting="ray_stall_timeout_s", gt=0)
    task_retries: int = surfaced(3, "times a call is run again after its replica died", ge=0)
    connect_timeout_s: float = surfaced(10.0, "seconds a HOST:PORT address may take to answer", gt=0)

    def __post_init__(self) -> None:
        check_bounds(self)


def flag_fields() -> list:
    """The fields of `ClusterOptions` that are command-line flags, ``address`` (``--ray``) first."""
    return [f for f in fields(ClusterOptions) if f.metadata["flag"] is not None]


def dest_of(f) -> str:
    """Where argparse keeps the flag of field `f`: its flag's name (``--ray`` -> ``ray``, ``--replicas`` ->
    ``replicas``)."""
    return f.metadata["flag"].removeprefix("--").replace("-", "_")


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One flag per flag field of `ClusterOptions`, in a group of their own; unset flags read None.
    ``--ray`` takes an optional ADDRESS (bare: the field's default, ``local``)."""
    group = parser.add_argument_group("on a Ray cluster (pip install 'bart-opt[ray]')")
    hints = typing.get_type_hints(ClusterOptions)
    for f in flag_fields():
        help_text = f.metadata["help"].replace("%", "%%")
        if f.metadata["switch"]:
            group.add_argument(f.metadata["flag"], dest=dest_of(f), nargs="?", const=f.default, metavar="ADDRESS",
                               help=help_text)
            continue
        kind = next(t for t in (int, float, str) if t is hints[f.name] or t in typing.get_args(hints[f.name]))
        group.add_argument(f.metadata["flag"], dest=dest_of(f), type=kind, help=help_text)


def from_cli_args(args: argparse.Namespace) -> ClusterOptions | None:
    """The `ClusterOptions` of the flags `add_cli_args` added (the defaults for those not given); None
    without ``--ray``."""
    given = {f.name: getattr(args, dest_of(f), None) for f in flag_fields()}
    if given["address"] is None:
        return None
    return ClusterOptions(**{name: value for name, value in given.items() if value is not None})


__all__ = ["LOCAL", "ClusterOptions", "add_cli_args", "dest_of", "flag_fields", "from_cli_args"]
