"""``ferry get REPO_ID [--revision R] [--plan] [--into DIR] [--file F]
[--trunk-format F] [--expert-format F] [--delete-source] [--json]``, and
``ferry get --login`` / ``--logout`` / ``--catalogue``."""
from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Sequence

from app.convert.format_choices import RECOMMENDED
from app.convert.layout import FORMAT_CHOICES
from app.untrusted import shown


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferry get", description=(
        "Plan, download and convert a model from the Hugging Face hub (or the mirror in HF_ENDPOINT). "
        "This is the only Ferry command that uses the network."))
    p.add_argument("repo", nargs="?", help="owner/name, e.g. moonshotai/Kimi-K2-Instruct")
    p.add_argument("--revision", help="a branch, tag or commit (default: main)")
    p.add_argument("--plan", action="store_true",
                   help="fetch only the small files and say whether and how fast it would run here")
    p.add_argument("--into", help="the folder to download and convert into (default: Ferry's models folder)")
    p.add_argument("--file", help="for a GGUF repository: the file (quantization) to get")
    formats = FORMAT_CHOICES + (RECOMMENDED,)
    p.add_argument("--trunk-format", choices=formats, default=RECOMMENDED,
                   help="as for `ferry convert` (default: what `ferry check` recommends here)")
    p.add_argument("--expert-format", choices=formats, default=RECOMMENDED,
                   help="as for `ferry convert` (default: what `ferry check` recommends here)")
    p.add_argument("--delete-source", action="store_true",
                   help="delete each downloaded shard once everything it holds is converted "
                        "(the disk then needs the container plus the shards in flight)")
    p.add_argument("--threads", type=int, default=None, help="conversion threads (default: one per core)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--catalogue", action="store_true",
                   help="the models known to work, each planned on this machine (no network)")
    p.add_argument("--login", action="store_true", help="keep a hub access token in the OS keychain")
    p.add_argument("--logout", action="store_true", help="remove the token from the keychain")
    return p


def _printer(quiet: bool):
    from app.units import size

    last = [0.0]

    def show(p) -> None:
        import time
        if quiet:
            return
        now = time.monotonic()
        if p.note:
            print(f"  {shown(p.note)}", file=sys.stderr, flush=True)
            p.note = ""
        if now - last[0] < 1.0 and p.stage != "done":
            return
        last[0] = now
        parts = []
        if p.download_total:
            eta = f", {p.eta / 60:.0f} min left" if p.eta is not None and p.eta > 60 else (
                f", {p.eta:.0f} s left" if p.eta is not None else "")
            parts.append(f"downloaded {size(p.downloaded)} of {size(p.download_total)} at "
                         f"{p.rate / 1e6:.1f} MB/s{eta}")
        if p.convert_total:
            parts.append(f"converted {size(p.converted)} of {size(p.convert_total)} ({p.convert_stage})")
        if p.paused:
            parts.append("paused")
        if parts:
            print("  " + "; ".join(parts), file=sys.stderr, flush=True)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    from app.convert.convert import ConvertCancelled, ConvertError
    from app.convert.errors import SourceError
    from app.get.hub import GetError, forget_token, store_token

    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if a.login:
            token = getpass.getpass("Hugging Face access token (kept in the OS keychain): ")
            store_token(token)
            print("ferry: the token is in the keychain", file=sys.stderr)
            return 0
        if a.logout:
            forget_token()
            return 0
        if a.catalogue:
            from app.get.catalogue import catalogue, describe_catalogue
            rows = catalogue()
            print(json.dumps([r.as_dict() for r in rows], indent=1) if a.json else describe_catalogue(rows))
            return 0
        if not a.repo:
            print("ferry get: error: give a repository (owner/name), or --catalogue", file=sys.stderr)
            return 2
        from pathlib import Path

        from app.paths import models_dir
        into = Path(a.into) if a.into else models_dir()
        if a.plan:
            from app.get.plan import describe, plan_repo, to_json
            if not a.json:
                print(f"ferry: asking {shown(_host())} about {shown(a.repo)} (small files only)", file=sys.stderr)
            plan = plan_repo(a.repo, a.revision, into, trunk_format=a.trunk_format,
                             expert_format=a.expert_format, file=a.file)
            print(to_json(plan) if a.json else describe(plan))
            return 0 if plan.verdict != "does not fit" else 1
        from app.get.pipeline import Getter
        if not a.quiet:
            print(f"ferry: downloading {shown(a.repo)} from {shown(_host())} into {shown(into)} (the network is "
                  f"used until it is downloaded; Ctrl-C stops, the same command resumes)", file=sys.stderr)
        getter = Getter(a.repo, into, revision=a.revision, trunk_format=a.trunk_format,
                        expert_format=a.expert_format, file=a.file, delete_source=a.delete_source,
                        progress=_printer(a.quiet or a.json), threads=a.threads)
        try:
            out = getter.run()
        except KeyboardInterrupt:
            print("ferry: stopped; run the same command to resume", file=sys.stderr)
            return 130
        if a.json:
            plan = getter.plan.as_dict() if getter.plan else None
            print(json.dumps({"container": str(out), "plan": plan}, indent=1))
        else:
            print(out)
        return 0
    except ConvertCancelled as exc:
        print(f"ferry: {shown(exc)}", file=sys.stderr)
        return 130
    except (GetError, ConvertError, SourceError, OSError) as exc:
        print(f"ferry: error: {shown(exc)}", file=sys.stderr)
        return 1


def _host() -> str:
    from app.get.hub import endpoint
    return endpoint()
