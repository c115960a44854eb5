"""A container ready to chat: the C engine, the tokenizer, the chat template
and the generation loop. No Qt: the CLI, the GUI worker and tests drive this.

Generation is a stream of events so that any front end can render it:
``PromptProgress`` while the prompt is processed, ``Token`` for each piece of
answer text, and a final ``Finished`` with the reason and the statistics.
"""
from __future__ import annotations

import hashlib
import math
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from app.chat.hf_tokenizer import HFTokenizer
from app.chat.segments import Segment
from app.chat.template import ChatTemplate
from app.engine.binding import Cancelled, Engine, FerryError, Session
from app.engine.container_files import (MAX_TEMPLATE_BYTES, MAX_TOKENIZER_BYTES, ContainerFileError,
                                         check_weight_files, contained_file, read_contained_text, read_manifest)
from app.events import EngineEvent, Finished, ImageProgress, PromptProgress, Token, TokenLogprob
from app.sampling import Sampler, SamplingParams, top_order
from app.store.private import write_private

#: The learned hot list beside a container: uint32 expert use counts [layers, experts].
USAGE_FILE = "usage.u32"
# The expert-cache policy's learned state (docs/CACHE_POLICY.md), beside the hot list.
POLICY_STATE_FILE = "usage.state"
#: The largest session state a recurrent model keeps in RAM for the next turn to resume from
#: (``LoadedModel.generate``'s ``resume_at``); a larger one is not kept (the next turn reads its prompt again).
RESUME_STATE_MAX_BYTES = 1 << 30


Event = EngineEvent


class ModelError(RuntimeError):
    """A container that cannot be used for chat (missing tokenizer, bad manifest...)."""


class StreamDecoder:
    """Token ids to text, one piece at a time, never splitting a UTF-8 character."""

    def __init__(self, tokenizer: HFTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = self.tokenizer.decode(self.ids)
        if full.endswith("\ufffd"):
            return ""  # an incomplete multi-byte character: wait for more
        piece = full[len(self.text):] if full.startswith(self.text) else full
        self.text = full
        return piece


class TiktokenContainerTokenizer:
    """A container whose tokenizer is a tiktoken BPE file (the Kimi family):
    the K3 tokenizer (app/chat/tiktoken_tokenizer.py) behind HFTokenizer's
    interface, with the manifest's stop and BOS ids."""

    def __init__(self, path: Path, *, eos_ids=(), bos_id: int | None = None):
        from app.chat.tiktoken_tokenizer import K3Tokenizer

        try:
            self._tok = K3Tokenizer.from_file(path)
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path.name}: cannot load tokenizer: {exc}") from exc
        self.eos_ids = frozenset(int(i) for i in eos_ids) or frozenset([self._tok.eos_id])
        self.bos_id = bos_id
        self.special_ids = self._tok.special_ids
        self.vocab_size = self._tok.vocab_size

    def encode_markup(self, text: str) -> list[int]:
        return self._tok.encode_markup(text)

    def encode_content(self, text: str) -> list[int]:
        return self._tok.encode_content(text)

    def encode_segments(self, segments) -> list[int]:
        return self._tok.encode_segments(segments)

    def decode(self, ids, *, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i not in self.special_ids]
        return self._tok.decode(ids)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode_token_bytes(int(token_id)).decode("utf-8", "replace")


class LoadedModel:
    def __init__(self, path: str | Path, *, ram_budget: int = 0, threads: int = 0, n_ctx: int = 0,
                 **engine_options):
        self.path = Path(path)
        try:
            self.manifest = read_manifest(self.path)
            check_weight_files(self.path, self.manifest)
        except ContainerFileError as exc:
            raise ModelError(f"{self.path}: {exc}") from None
        except OSError as exc:
            raise ModelError(f"{self.path / 'manifest.json'}: {exc}") from exc
        engine_options.setdefault("usage_counts", self._load_usage())
        engine_options.setdefault("policy_state", self._load_policy_state())
        try:
            self.engine = Engine(self.path, ram_budget=ram_budget, threads=threads, n_ctx=n_ctx, **engine_options)
        except FerryError as exc:
            # A saved state from another build or a damaged file: start cold, lose nothing else.
            if engine_options.get("policy_state") is None or "cache policy state" not in str(exc):
                raise
            engine_options["policy_state"] = None
            self.engine = Engine(self.path, ram_budget=ram_budget, threads=threads, n_ctx=n_ctx, **engine_options)
        tok = self.manifest.get("tokenizer") or {}
        try:
            self._open_tokenizer(tok if isinstance(tok, dict) else {})
        except BaseException:
            self.engine.close()
            raise

    def _open_tokenizer(self, tok: dict) -> None:
        """The tokenizer and chat template the manifest names, read only from inside the container."""
        if tok.get("kind") not in ("tiktoken", "hf-tokenizers"):
            raise ModelError(f"this container's tokenizer kind {tok.get('kind')!r} is not supported yet")
        try:
            tok_path = contained_file(self.path, tok.get("file"), "tokenizer.file", MAX_TOKENIZER_BYTES)
            template_file = tok.get("chat_template")
            source = (read_contained_text(self.path, template_file, "tokenizer.chat_template", MAX_TEMPLATE_BYTES)
                      if template_file else None)
        except ContainerFileError as exc:
            raise ModelError(f"{self.path}: {exc}") from None
        if tok.get("kind") == "tiktoken":
            self.tokenizer = TiktokenContainerTokenizer(tok_path, eos_ids=tok.get("eos_ids", []),
                                                        bos_id=tok.get("bos_id"))
        else:
            self.tokenizer = HFTokenizer(tok_path, eos_ids=tok.get("eos_ids", []), bos_id=tok.get("bos_id"))
        self.add_bos = bool(tok.get("add_bos"))
        self.template = None
        if source is not None:
            self.template = ChatTemplate(source, bos_token=tok.get("bos_token"), eos_token=tok.get("eos_token"))

    # ---- images (Kimi K3's vision tower; app/vision, docs/KIMI.md "Images")

    @property
    def vision_config(self) -> dict | None:
        """The manifest's ``model.vision`` section, or None: the model cannot see images."""
        v = (self.manifest.get("model") or {}).get("vision")
        return v if isinstance(v, dict) else None

    @property
    def recurrent(self) -> bool:
        """Whether the model has recurrent (KDA) layers: its session cannot rewind to a shorter prefix, so a
        follow-up turn resumes from the state the previous turn kept (``generate``'s ``resume_at``)."""
        kimi = (self.manifest.get("model") or {}).get("kimi") or {}
        return "kda" in (kimi.get("layer_attn") or ())

    def prepare_image(self, data: bytes, name: str = "image", patch_budget: int | None = None):
        """Encoded image bytes -> a PreparedImage for this model's tower (ImageError on a bad image,
        ModelError when the model has no tower). The same bytes and budget give the cached result."""
        from app.vision.image import DEFAULT_PATCH_BUDGET, prepare

        cfg = self.vision_config
        if cfg is None:
            raise ModelError(f"{self.name} cannot see images (it has no vision tower)")
        budget = int(patch_budget or DEFAULT_PATCH_BUDGET)
        key = (hashlib.sha256(data).hexdigest(), budget, name)
        cache = self.__dict__.setdefault("_prepared_images", {})
        if key not in cache:
            if len(cache) >= 16:
                cache.pop(next(iter(cache)))
            cache[key] = prepare(data, name, patch_budget=budget, patch=int(cfg["patch_size"]),
                                 merge=int(cfg["merge_h"]), thumbnail=0)
        return cache[key]

    def image_rows(self, image, observer=None) -> np.ndarray:
        """The tower's output for a PreparedImage: [positions, dim], kept for the
        last few images so a second question about one does not run the tower again."""
        from app.engine.binding import Vision

        cache = self.__dict__.setdefault("_image_rows", {})
        if image.key in cache:
            return cache[image.key]
        if getattr(self, "_vision", None) is None:
            self._vision = Vision(self.path, self.vision_config, threads=self.engine.info.n_threads)
        rows = self._vision.encode(image.patches, image.grid.gh, image.grid.gw, observer)
        if len(cache) >= 8:
            cache.pop(next(iter(cache)))
        cache[image.key] = rows
        return rows

    @property
    def name(self) -> str:
        """The model's one name: its folder's (the library's, the switcher's, the server's model id, the
        CLI's), without a ``.ferry`` suffix; what it was converted from is ``source_name``."""
        from app.library import display_name

        return display_name(self.path.name)

    @property
    def source_name(self) -> str:
        """The file or folder it was converted from (kept in its manifest)."""
        return self.manifest.get("source", {}).get("name", self.path.name)

    def new_session(self, n_ctx: int = 0) -> Session:
        return self.engine.session(n_ctx)

    # ---- prompts (the chat format itself is app.chat.turn.ChatFormat: one renderer for every front end)

    def encode(self, segments: Sequence[Segment]) -> list[int]:
        ids = self.tokenizer.encode_segments(segments)
        if self.add_bos and self.tokenizer.bos_id is not None and (not ids or ids[0] != self.tokenizer.bos_id):
            ids.insert(0, self.tokenizer.bos_id)
        return ids

    def encode_chat(self, messages: list[dict[str, Any]], thinking: bool = True) -> list[int]:
        """The prompt ids of ``messages`` in this model's chat format (as every front end renders them)."""
        from app.chat.turn import ChatFormat, TurnRequest

        return ChatFormat(self).prepare(TurnRequest(messages, thinking=thinking), n_ctx=1 << 62).prompt

    def encode_plain(self, text: str) -> list[int]:
        return self.encode([(text, False)])

    # ---- generation

    def generate(self, session: Session, prompt: Sequence[int], params: SamplingParams | None = None, *,
                 max_tokens: int = 256, stop_ids: Sequence[int] | None = None, reuse_limit: int | None = None,
                 top_logprobs: int | None = None, images: Sequence[Any] = (),
                 forced: deque[int] | None = None, resume_at: int = 0) -> Iterator[Event]:
        """Answer after ``prompt`` (the whole conversation's tokens); the session
        reuses whatever prefix of it it already holds, at most ``reuse_limit``
        tokens of it (0: evaluate the whole prompt). ``top_logprobs`` (0-20)
        attaches each token's log-probability and that many alternatives.
        ``images`` (PreparedImage, in prompt order) fill the prompt's image
        positions (the placeholder ids of their blocks) with the tower's rows;
        an image already in the reused prefix is not run through the tower again,
        and one that goes through it reports each block (``ImageProgress``).
        ``forced``: ids the caller may add while the answer streams; each is
        the next token instead of a sampled one (a thinking budget's end).
        ``resume_at`` (a recurrent model, ``Prepared.resume_len``): the session's
        state after that many prompt tokens is kept (``Session.resume_point``), and
        a later prompt that begins with them resumes from it instead of reading
        them again, where the session cannot rewind to them (bit-identical:
        the evaluation does not depend on where the prompt is cut)."""
        params = params or SamplingParams()
        sampler = Sampler(params)
        stops = set(stop_ids if stop_ids is not None else self.tokenizer.eos_ids)
        t0 = time.monotonic()
        prompt = list(prompt)
        if len(prompt) >= session.n_ctx:
            yield self._finished(session, "error", [], "", 0, 0, t0,
                                 f"the prompt has {len(prompt)} tokens but the context holds {session.n_ctx}")
            return
        try:
            keys, where = self._image_positions(prompt, images)
        except ModelError as exc:
            yield self._finished(session, "error", [], "", 0, 0, t0, str(exc))
            return
        logits = None
        resumed = self._resume(session, keys, reuse_limit)
        if resumed is not None:
            kept, logits = resumed
        else:
            kept = session.sync(keys)
            if reuse_limit is not None and kept > reuse_limit:
                try:
                    session.truncate(max(0, reuse_limit))
                    kept = max(0, reuse_limit)
                except FerryError:  # a recurrent state cannot rewind: start over
                    session.reset()
                    kept = 0
        keep_at = resume_at if self.recurrent and 0 < resume_at <= len(prompt) else 0
        todo = prompt[kept:]
        decoder = StreamDecoder(self.tokenizer)
        out: list[int] = []
        ttft = None
        try:
            # The images this prompt still needs go through the tower first (a phase of its own: the
            # progress starts at 0 of the prompt, then each block); those in the reused prefix are not run again.
            yield from self._tower(session, images, sorted({j for p, (j, _) in where.items() if p >= kept}),
                                   len(todo))
            pos = kept
            while pos < len(prompt):
                hi = min(len(prompt), pos + session.prompt_step)
                if pos < keep_at < hi:
                    hi = keep_at        # a chunk ends where the next turn will resume
                try:
                    logits = self._eval_chunk(session, prompt, keys, where, images, pos, hi)
                except FerryError as exc:
                    # A recurrent state (KDA) cannot rewind to a shorter prefix:
                    # the core says so, and the prompt is evaluated from the start.
                    if exc.code != "FERRY_E_UNSUPPORTED" or pos > kept or kept == 0:
                        raise
                    session.reset()
                    kept, todo, pos = 0, prompt, 0
                    continue
                pos = hi
                if pos == keep_at:
                    self._keep_resume_point(session, logits if pos == len(prompt) else None)
                yield PromptProgress(pos - kept, len(todo))
            reason = "length"
            for _ in range(max_tokens):
                tok = forced.popleft() if forced else sampler(logits)
                if ttft is None:
                    ttft = time.monotonic() - t0
                if tok in stops:
                    reason = "stop"
                    break
                out.append(tok)
                yield Token(tok, decoder.push(tok), _logprob(logits, tok, top_logprobs))
                if session.position >= session.n_ctx:
                    break
                logits = session.eval([tok])
        except Cancelled:
            yield self._finished(session, "cancelled", out, decoder.text, len(todo), kept, t0, ttft=ttft)
            return
        except Exception as exc:  # an I/O error mid-answer ends this answer, not the app
            yield self._finished(session, "error", out, decoder.text, len(todo), kept, t0, str(exc), ttft=ttft)
            return
        yield self._finished(session, reason, out, decoder.text, len(todo), kept, t0, ttft=ttft)

    def _resume(self, session: Session, keys: list[int], reuse_limit: int | None):
        """(tokens kept, logits or None) after restoring the state an earlier turn kept
        (``Session.resume_point``), when ``keys`` begin with its tokens and the session would otherwise
        have to rewind (or read more); None: the session goes on as it is."""
        point = getattr(session, "resume_point", None)
        if point is None or not self.recurrent:
            return None
        state, logits = point
        n = len(state.tokens)
        if (reuse_limit is not None and n > reuse_limit) or n > len(keys) or keys[:n] != state.tokens \
                or (n == len(keys) and logits is None):
            return None
        held = 0
        for a, b in zip(session.tokens, keys):
            if a != b:
                break
            held += 1
        if held == len(session.tokens) and n <= held < len(keys):
            return None         # it goes on from what it holds, which is as far or further
        try:
            session.import_state(state)
        except FerryError:
            return None
        return n, (logits.copy() if n == len(keys) else None)

    @staticmethod
    def _keep_resume_point(session: Session, logits: np.ndarray | None) -> None:
        """Keep the session's state (and the prompt's last logits when it ends there) for the next turn."""
        session.resume_point = None
        state = session.export_state()
        if len(state.blob) <= RESUME_STATE_MAX_BYTES:
            session.resume_point = (state, None if logits is None else logits.copy())

    def _tower(self, session: Session, images: Sequence[Any], todo: list[int],
               prompt_left: int) -> Iterator[ImageProgress | PromptProgress]:
        """Run the images ``todo`` (indexes into ``images``) through the vision tower, one block's
        ``ImageProgress`` at a time: the tower works on a thread of its own while this generator
        reports; a cancel (``Session.cancel``) or closing the generator stops it between blocks."""
        cache = self.__dict__.setdefault("_image_rows", {})
        todo = [j for j in todo if images[j].key not in cache]
        if not todo:
            return
        yield PromptProgress(0, prompt_left)
        blocks = int(self.vision_config["layers"])
        for n, j in enumerate(todo, 1):
            marks: queue.SimpleQueue = queue.SimpleQueue()
            stop = threading.Event()
            failed: list[BaseException] = []

            def observer(stage: int, rows) -> bool:
                if stop.is_set() or session.take_cancel():
                    return False
                if 1 <= stage <= blocks:
                    marks.put(stage)
                return True

            def work(image=images[j]) -> None:
                try:
                    self.image_rows(image, observer)
                except BaseException as exc:   # handed to the generator's thread
                    failed.append(exc)
                finally:
                    marks.put(None)

            worker = threading.Thread(target=work, name="ferry-vision", daemon=True)
            yield ImageProgress(n, len(todo), 0, blocks)
            worker.start()
            try:
                while (stage := marks.get()) is not None:
                    yield ImageProgress(n, len(todo), stage, blocks)
            finally:
                stop.set()
                worker.join()
            if failed:
                raise failed[0]

    def _image_positions(self, prompt: list[int], images: Sequence[Any]) -> tuple[list[int], dict[int, tuple]]:
        """The session keys of the prompt (its ids, with each image position
        keyed by its image's identity so that a prefix is reused only for the
        same image) and image position -> (image index, row)."""
        cfg = self.vision_config
        if not images:
            return prompt, {}
        if cfg is None:
            raise ModelError(f"{self.name} cannot see images (it has no vision tower)")
        pad = int(cfg.get("media_pad_id", -1))
        spots = [i for i, t in enumerate(prompt) if t == pad]
        want = sum(img.positions for img in images)
        if len(spots) != want:
            raise ModelError(f"the prompt has {len(spots)} image positions but its images need {want}")
        keys, where, k = list(prompt), {}, 0
        for j, img in enumerate(images):
            h = int(img.key[:8], 16)
            for r in range(img.positions):
                keys[spots[k]] = -1 - (h + r) % (2 ** 31 - 2)   # never a token id
                where[spots[k]] = (j, r)
                k += 1
        return keys, where

    def _eval_chunk(self, session: Session, prompt, keys, where, images, lo: int, hi: int):
        """Evaluate prompt[lo:hi], image positions taking the tower's rows."""
        spots = [p for p in range(lo, hi) if p in where]
        if not spots:
            return session.eval(prompt[lo:hi], keys=keys[lo:hi] if where else None)
        embeds = np.zeros((hi - lo, self.engine.info.dim), dtype=np.float32)
        use = np.zeros(hi - lo, dtype=bool)
        for p in spots:
            j, r = where[p]
            embeds[p - lo] = self.image_rows(images[j], lambda stage, rows: not session.take_cancel())[r]
            use[p - lo] = True
        return session.eval(prompt[lo:hi], embeds=embeds, use=use, keys=keys[lo:hi])

    def _finished(self, session, reason, out, text, n_prompt, kept, t0, error=None, ttft=None) -> Finished:
        return Finished(reason=reason, tokens=list(out), text=text, prompt_tokens=n_prompt, reused_tokens=kept,
                        seconds=time.monotonic() - t0, stats=session.stats(), error=error, ttft_s=ttft)

    def _load_usage(self) -> np.ndarray | None:
        """The hot list an earlier run saved, so the cache starts warm."""
        path = self.path / USAGE_FILE
        model = self.manifest.get("model") or {}
        expected = int(model.get("n_layers") or 0) * int((model.get("moe") or {}).get("n_experts") or 0)
        try:
            counts = np.fromfile(path, dtype="<u4") if path.exists() and expected else None
        except OSError:
            return None
        return counts if counts is not None and counts.size == expected else None

    def _load_policy_state(self) -> bytes | None:
        """The cache policy's learned state an earlier run saved (the engine
        checks that it fits; see __init__ for one that does not)."""
        path = self.path / POLICY_STATE_FILE
        try:
            return path.read_bytes() if path.is_file() else None
        except OSError:
            return None

    def save_usage(self) -> None:
        """Record which experts were used and what the cache policy learned,
        for the next open (best effort: a read-only container simply starts
        cold next time)."""
        if not self.engine.info.n_moe_layers:
            return
        try:   # private: which experts ran hints at what was asked
            write_private(self.path / USAGE_FILE, self.engine.usage().astype("<u4").tobytes())
            write_private(self.path / POLICY_STATE_FILE, self.engine.policy_state())
        except OSError:
            pass

    def close(self) -> None:
        if self.engine._ptr is not None:
            self.save_usage()
        if getattr(self, "_vision", None) is not None:
            self._vision.close()
            self._vision = None
        self.engine.close()
        holding = getattr(self, "holding", None)   # app.api.open_model's registry hold
        if holding is not None:
            holding.release()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of the next token from raw logits (float64)."""
    z = logits.astype(np.float64)
    return z - (z.max() + math.log(np.exp(z - z.max()).sum()))


def _logprob(logits: np.ndarray, tok: int, top: int | None) -> TokenLogprob | None:
    if top is None:
        return None
    logp = log_softmax(logits)
    best = top_order(logp, top)   # the head of a stable sort, without sorting the vocabulary
    return TokenLogprob(float(logp[tok]), tuple((int(i), float(logp[i])) for i in best))


def run_to_end(events: Iterator[Event], on_token: Callable[[str], None] | None = None) -> Finished:
    """Drain a generation, passing answer text to ``on_token``; returns the end."""
    for ev in events:
        if isinstance(ev, Token) and on_token:
            on_token(ev.text)
        elif isinstance(ev, Finished):
            return ev
    raise RuntimeError("generation ended without a Finished event")
