"""``ferry docs``: private documents from the command line.

    ferry docs add COLLECTION PATH...                  read and index files and folders
    ferry docs search COLLECTION QUESTION [-k N] [--json] [--mode hybrid|bm25|ngram]
    ferry docs ask MODEL COLLECTION QUESTION [--json] [--context-tokens N] [-n N]
        (MODEL a server's URL: the passages chosen and the question are sent there)
    ferry docs list [COLLECTION] [--json]
    ferry docs remove COLLECTION [PATH...]
    ferry docs budget COLLECTION TOKENS

The store is the history's (encrypted with the key in the OS keychain).
Where there is no keychain, or the history was made with a passphrase, the
passphrase is read from the terminal. ``FERRY_PASSPHRASE`` (for scripts)
gives it instead, by the rule the window follows too
(``app.store.passphrase.environment_keys``).
"""
from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from app.documents.walk import display_name
from app.store.crypto import KeychainKeys, KeyUnavailable, PassphraseKeys, WrongKey, keychain_problem
from app.store.history import default_path, stored_key_kind
from app.store.passphrase import LOST_PASSPHRASE_WARNING, environment_keys, passphrase_problem
from app.text_input import text_argument_problem


def key_provider(db_path: Path):
    # FERRY_PASSPHRASE first, by the rule the window follows too (whatever the
    # keyring backend, unless the history was made with a keychain key).
    keys = environment_keys(db_path)
    if keys is not None:
        return keys
    kind = stored_key_kind(db_path)
    if kind == "passphrase" or (kind is None and keychain_problem() is not None):
        if not sys.stdin.isatty():
            why = "the history is protected by a passphrase" if kind == "passphrase" else keychain_problem()
            raise KeyUnavailable(f"{why}; set FERRY_PASSPHRASE or run from a terminal")
        passphrase = getpass.getpass("Ferry passphrase: ")
        if kind is None:
            passphrase = _confirm_new(passphrase)
        return PassphraseKeys(passphrase)
    return KeychainKeys()


def _confirm_new(passphrase: str) -> str:
    """A new history's passphrase typed at the terminal: checked against the rule and typed twice."""
    print(LOST_PASSPHRASE_WARNING, file=sys.stderr)
    while (problem := passphrase_problem(passphrase)):
        print(problem, file=sys.stderr)
        passphrase = getpass.getpass("Ferry passphrase: ")
    if getpass.getpass("The same passphrase again: ") != passphrase:
        raise KeyUnavailable("the two passphrases differ; nothing was created")
    return passphrase


def open_store():
    from app.documents.store import DocumentStore

    path = default_path()
    return DocumentStore(path, key_provider(path))


def _progress(p) -> None:
    if p.stage == "failed":
        print(f"  skipped {display_name(p.path.name)}: {p.message}", file=sys.stderr, flush=True)
    elif p.stage in ("indexed", "unchanged"):
        extra = f" ({p.message})" if p.message else ""
        print(f"  [{p.done}/{p.total}] {p.stage} {p.path.name}{extra}", file=sys.stderr, flush=True)


def _print_report(collection: str, report, as_json: bool) -> int:
    if as_json:
        print(json.dumps(report.as_dict(), indent=1, ensure_ascii=False), flush=True)
    else:
        print(f"{collection}: {len(report.added)} added ({report.chunks} passages), "
              f"{len(report.unchanged)} unchanged, {len(report.failed)} skipped, {report.seconds:.1f} s", flush=True)
        for p, why in report.failed:
            print(f"  skipped {display_name(p)}: {why}", flush=True)
    return 1 if report.failed else 0


def cmd_add(args) -> int:
    with open_store() as store:
        report = store.add(args.collection, args.paths, progress=None if args.json else _progress,
                           watch=True if args.watch else None)
        status = _print_report(args.collection, report, args.json)
        if args.watch:
            _watch(store, args.interval, args.json)
    return status


def _watch(store, interval: float, as_json: bool) -> None:
    """Keep the watched folders in sync (app.documents.indexer.FolderWatcher) until Ctrl-C."""
    import threading

    from app.documents.indexer import FolderWatcher

    lock = threading.Lock()

    def changed(reports) -> None:
        with lock:
            for key, report in reports.items():
                _print_report(key.split(":", 1)[0], report, as_json)

    print(f"watching (every {interval:g} s or more); Ctrl-C stops", file=sys.stderr, flush=True)
    watcher = FolderWatcher(store, interval=interval, on_change=changed).start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopped watching", file=sys.stderr, flush=True)
    finally:
        watcher.stop()


def cmd_reindex(args) -> int:
    """New, changed and deleted files of the collection's sources (as the window's Re-index)."""
    with open_store() as store:
        report = store.rescan(args.collection, progress=None if args.json else _progress)
    return _print_report(args.collection, report, args.json)


def _hit_dict(rank: int, h) -> dict:
    c = h.chunk
    return {"rank": rank, "score": round(h.score, 6), "bm25": round(h.bm25, 6), "ngram": round(h.ngram, 6),
            "file": c.file_name, "path": c.path, "page": c.page, "heading": c.heading, "start": c.start,
            "end": c.end, "text": c.text, "chunk_id": c.id, "file_id": c.file_id}


def cmd_search(args) -> int:
    from app.documents.retrieve import search

    with open_store() as store:
        hits = search(store.index(args.collection), args.question, k=args.k, mode=args.mode)
    rows = [_hit_dict(i + 1, h) for i, h in enumerate(hits)]
    if args.json:
        print(json.dumps({"collection": args.collection, "question": args.question, "mode": args.mode,
                          "results": rows}, indent=1, ensure_ascii=False))
    else:
        for r in rows:
            where = r["file"] + (f", page {r['page']}" if r["page"] is not None else "")
            print(f"{r['rank']}. {where}  ({r['score']:.3f})\n   {r['text'][:300]}")
    return 0


def cmd_ask(args) -> int:
    from app.cli.common import PromptMeter, Turns, logprobs_problem, turn_request
    from app.documents.ask import Answer, DocumentChat
    from app.api import StateCache
    from app.events import PromptProgress, Text

    if (bad := logprobs_problem(args)):
        print(bad, file=sys.stderr)
        return 2
    with open_store() as store:
        store.collection(args.collection)      # fail before loading the model
        answer = None
        request = turn_request(args, [])
        # a model here (its document prefixes saved and restored) or a server the user named: retrieval here
        turns = Turns(args, states=StateCache(store.keys.states))
        events = DocumentChat(turns.engine, store).ask(args.collection, args.question, budget=args.context_tokens,
                                                       mode=args.mode, request=request)
        close = turns.close
        meter = PromptMeter() if not args.json else None
        try:
            for ev in events:
                if isinstance(ev, PromptProgress) and meter is not None:
                    meter.update(ev.done, ev.total)
                    continue
                if meter is not None:
                    meter.clear()
                if isinstance(ev, Text) and not args.json:
                    print(ev.text, end="", flush=True)
                elif isinstance(ev, Answer):
                    answer = ev
        except KeyboardInterrupt:   # Ctrl-C: the answer stops, nothing is kept
            print("\nferry: stopped", file=sys.stderr)
            return 130
        finally:
            close()
    assert answer is not None
    if args.json:
        print(json.dumps(answer.as_dict(), indent=1, ensure_ascii=False))
    else:
        print()
        if answer.text != answer.model_text:
            print(f"\n{answer.text}")
        print()
        for c in answer.citations or answer.passages[:3]:
            where = c.file + (f", page {c.page}" if c.page is not None else "")
            print(f"[{c.n}] {where}: {c.passage[:200]}")
        print(f"  [{answer.prompt_tokens} prompt tokens evaluated, {answer.reused_tokens} reused; "
              f"prefix {answer.prefix_state}]", file=sys.stderr)
    if answer.error:
        print(f"ferry: error: {answer.error}", file=sys.stderr)
    return 1 if answer.reason == "error" else 0


def cmd_list(args) -> int:
    with open_store() as store:
        if args.collection:
            files = store.files(args.collection)
            doc = [f.__dict__ for f in files]
        else:
            doc = [c.__dict__ for c in store.collections()]
    if args.json:
        print(json.dumps(doc, indent=1, ensure_ascii=False))
    elif args.collection:
        for f in doc:
            if f["status"] != "indexed":
                print(f"{f['name']}  skipped: {f['reason']}  {f['path']}")
                continue
            print(f"{f['name']}  {f['kind']}, {f['pages']} page(s), {f['chunks']} passages  {f['path']}")
    else:
        for c in doc:
            print(f"{c['name']}  {c['files']} files, {c['chunks']} passages, budget {c['budget']} tokens")
    return 0


def cmd_remove(args) -> int:
    with open_store() as store:
        if not args.paths:
            store.delete_collection(args.collection)
            print(f"removed the collection {args.collection}")
            return 0
        missing = [p for p in args.paths if not store.remove_file(args.collection, p)]
    for p in missing:
        print(f"ferry: {p} is not in {args.collection}", file=sys.stderr)
    return 1 if missing else 0


def cmd_budget(args) -> int:
    with open_store() as store:
        store.set_budget(args.collection, args.tokens)
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError("the interval must be between 0.1 and 86400 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    from app.cli.common import add_logprobs, add_model_options, add_sampling, add_server_model

    ap = argparse.ArgumentParser(prog="ferry docs", description="Ask about your own documents, offline.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("add", help="read and index files and folders into a collection")
    p.add_argument("collection")
    p.add_argument("paths", nargs="+")
    p.add_argument("--json", action="store_true")
    p.add_argument("--watch", action="store_true",
                   help="watch these folders: new, changed and deleted files are picked up (here until Ctrl-C, "
                        "and by the window while it runs)")
    p.add_argument("--interval", type=_seconds, default=5.0, help="with --watch: seconds between checks (at least)")
    p.set_defaults(fn=cmd_add)

    p = sub.add_parser("search", help="the passages that best match a question")
    p.add_argument("collection")
    p.add_argument("question")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--mode", choices=("hybrid", "bm25", "ngram"), default="hybrid")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_search)

    p = sub.add_parser("ask", help="answer a question from a collection, with citations",
                       description="Answer a question from a collection, with citations. Everything stays on this "
                                   "computer, unless MODEL is a server's URL: then the collection is still searched "
                                   "here, and the passages chosen (the documents' text) and the question are sent "
                                   "to that server, which writes the answer.")
    add_model_options(p)
    p.set_defaults(holder="`ferry docs ask`")
    add_server_model(p)
    add_logprobs(p)
    add_sampling(p, system=False)     # the same sampling, thinking and routing options as `ferry run`
    p.add_argument("collection")
    p.add_argument("question")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="token budget for passages (default: the collection's, 1024 unless set)")
    p.add_argument("--mode", choices=("hybrid", "bm25", "ngram"), default="hybrid")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_ask)

    p = sub.add_parser("list", help="collections, or the files of one")
    p.add_argument("collection", nargs="?")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("remove", help="remove files from a collection, or the whole collection")
    p.add_argument("collection")
    p.add_argument("paths", nargs="*")
    p.set_defaults(fn=cmd_remove)

    p = sub.add_parser("reindex", help="pick up new, changed and deleted files of a collection's sources")
    p.add_argument("collection")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_reindex)

    p = sub.add_parser("budget", help="set a collection's token budget for passages")
    p.add_argument("collection")
    p.add_argument("tokens", type=int)
    p.set_defaults(fn=cmd_budget)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from app.api import FerryError, ModelError, RemoteError, StateError
    from app.documents.store import DocumentError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from app.cli.common import number_argument_problem

    if (bad := text_argument_problem(args, ("collection", "question")) or number_argument_problem(args)):
        print(f"ferry: error: {bad}", file=sys.stderr)
        return 2
    from app.store.database import DatabaseError, database_problem

    try:
        return args.fn(args)
    except DatabaseError as exc:     # a damaged page, another process's write: what it means, one line
        print(f"ferry: error: {database_problem(exc, default_path())}", file=sys.stderr)
        return 1
    except (KeyUnavailable, WrongKey, DocumentError, StateError, FerryError, ModelError, ValueError,
            OSError, RemoteError) as exc:
        print(f"ferry: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
