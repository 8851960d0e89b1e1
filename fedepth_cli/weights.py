"""``fedepth weights``: the encoders' ImageNet checkpoints, where they are and whether they verify.

Nothing is downloaded: the command only looks (fedepth.models.checkpoints) and says, per encoder,
which registered models start from it, the file torchvision names, where it was found and
whether its SHA-256 matches the hash in that name. Exit 1 when a checkpoint that is needed (by
the models asked about; default: the CPU-size lite models, which the demo and the benchmark's
smoke and small profiles build) is missing or altered.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fedepth_cli.errors import CliError

#: the models whose checkpoints are needed unless --models names others
LITE = ("regression-lite", "adabins-lite", "newcrfs-lite", "dcdepth-lite")


def cmd_weights(args: argparse.Namespace) -> int:
    from fedepth.models import default_encoder, list_encoders, list_models
    from fedepth.models.checkpoints import ENV_DIR, find, search_dirs

    models = list_models()
    asked = tuple(m.strip() for m in args.models.split(",") if m.strip()) if args.models else LITE
    unknown = [m for m in asked if m not in models]
    if unknown:
        raise CliError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(models)}")
    users: dict[str, list[str]] = {e: [] for e in list_encoders()}
    for m in models:
        users[default_encoder(m)].append(m)
    needed = {default_encoder(m) for m in asked}
    rows: list[dict[str, Any]] = []
    for enc in list_encoders():
        found = find(enc)
        rows.append(
            {
                "encoder": enc,
                "models": users[enc],
                "checkpoint": found.checkpoint.file,
                "torchvision": found.checkpoint.weights,
                "needed": enc in needed,
                "path": None if found.path is None else str(found.path),
                "source": found.source,
                "sha256": found.sha256,
                "status": "verified" if found.ok else ("missing" if found.path is None else "BAD"),
                "error": found.error,
            }
        )
    bad = [r for r in rows if r["needed"] and r["status"] != "verified"]
    if args.json:
        print(json.dumps({"encoders": rows, "ok": not bad}, indent=2))
    else:
        print("searched, in order: " + ", ".join(f"{p} ({s})" for s, p in search_dirs()))
        print(f"(${ENV_DIR} names a folder searched first)\n")
        width = max(len(r["checkpoint"]) for r in rows)
        for r in rows:
            mark = "*" if r["needed"] else " "
            where = r["path"] if r["status"] != "missing" else "-"
            print(
                f"{mark} {r['encoder']:<19} {r['checkpoint']:<{width}}  {r['status']:<8}  "
                f"{where}  [{', '.join(r['models']) or 'no default model'}]"
            )
        print(f"\n* needed by {', '.join(asked)}")
        for r in bad:
            print(f"error: {r['error']}")
    return 1 if bad else 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "weights",
        help="list the encoders' ImageNet checkpoints: where they are, whether they verify",
        description=" ".join((__doc__ or "").replace("``", "").split()),
    )
    p.add_argument(
        "--models",
        metavar="M1,M2",
        help="the models whose checkpoints must be there (default: the lite models: "
        + ", ".join(LITE)
        + ")",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_weights)
