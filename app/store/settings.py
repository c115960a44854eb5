"""User settings, kept as JSON under ``app.paths.config_dir()``. No Qt here.

Settings holding the user's own text (PRIVATE_FIELDS) are encrypted with
the history's key (``HistoryStore.cipher``); the file is 0600.

The remote engine's API key is not in the file: it is kept in the OS
keychain (``keyring``, service "Ferry", one entry per server URL)."""
from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app import paths
from app.store.crypto import Cipher, WrongKey
from app.store.private import private_dir, write_private

FILE_NAME = "settings.json"
ENGINES = ("local", "remote")
from app.activations import DEFAULT_ACTIVATIONS, EXACT  # pure Python: settings load without the core
from app.context import DEFAULT_CONTEXT
KEYCHAIN_SERVICE = "Ferry"
DEFAULT_SERVE_PORT = 8000
#: Settings that hold the user's own text (a system prompt, presets...): stored
#: encrypted with the history's key under ENCRYPTED_KEY, never in the clear.
#: A new setting of user text is added here.
#: (presets and per-model values hold system prompts; stop sequences are the user's text too; MCP commands and
#: URLs may hold paths or tokens)
PRIVATE_FIELDS = frozenset({"system_prompt", "model_settings", "presets", "stop", "mcp_servers", "trusted_tools"})
ENCRYPTED_KEY = "encrypted"
MAX_SEED = (1 << 63) - 1
CONTEXT_POLICIES = ("drop_oldest", "summarise")   #: the window's choices (app.chat.turn's, but "error")
MAX_ALTERNATIVES = 20         #: = app.chat.turn.MAX_TOP_LOGPROBS
MAX_STOPS, MAX_STOP_CHARS = 4, 256   #: = app.chat.turn's (kept here so settings load without the pipeline)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def parse_stops(text: str) -> list[str]:
    """Stop sequences as typed, one a line; ``\\n``, ``\\t`` and ``\\\\`` stand for a newline, a tab and a backslash."""
    out = []
    for line in text.splitlines():
        chars, i = [], 0
        while i < len(line):
            if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in _ESCAPES:
                chars.append(_ESCAPES[line[i + 1]])
                i += 2
            else:
                chars.append(line[i])
                i += 1
        if chars:
            out.append("".join(chars))
    return out


def format_stops(stops: list[str]) -> str:
    """The text :func:`parse_stops` reads back as ``stops``."""
    return "\n".join(s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for s in stops)


@dataclass
class Settings:
    model_folders: list[str] = field(default_factory=list)  #: extra folders to look for containers in
    model_path: str = ""          #: the container opened last
    ram_budget: int = 0           #: bytes for the core; 0 = the recommended value
    threads: int = 0              #: compute threads; 0 = one per CPU
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    thinking: bool = True         #: let thinking models think before answering
    system_prompt: str = ""
    context_length: int = DEFAULT_CONTEXT
    max_tokens: int = 1024        #: longest answer
    engine: str = "local"         #: "local" (a model on this computer) or "remote" (an OpenAI-compatible server)
    remote_url: str = ""          #: the server's API base, e.g. http://gpu-box:8000/v1
    remote_model: str = ""        #: the model to ask for there ("" = the first it lists)
    serve_local: bool = False     #: serve the loaded model on 127.0.0.1:serve_port
    serve_port: int = DEFAULT_SERVE_PORT
    enter_sends: bool = True      #: Enter sends and Shift+Enter makes a new line (False: the other way round)
    experts_per_token: int | None = None  #: routed experts per token (None = the model's own); issue 17's opt-in
    cache_aware_margin: float = 0.0       #: cache-aware routing margin (0 = exact routing); issue 17's opt-in
    model_settings: dict = field(default_factory=dict)  #: model key -> its own values of PER_MODEL keys
    presets: dict = field(default_factory=dict)         #: preset name -> values of PER_MODEL keys
    verify_reads: bool = False    #: check each expert record's CRC32 when first read (costs CPU per GB read)
    activations: str = DEFAULT_ACTIVATIONS   #: "auto" (8-bit activations on quantized weights) or "exact"
    seed: int | None = None       #: the sampler's seed (None: a fresh one each answer); a seed makes answers repeat
    token_probabilities: bool = False  #: keep each answer's token probabilities and show them under it
    token_alternatives: int = 5   #: the likeliest other tokens kept per token (0-20, as the API's top_logprobs)
    stop: list[str] = field(default_factory=list)  #: the answer ends before the first of these (at most 4)
    frequency_penalty: float = 0.0   #: -2..2 (OpenAI's): times how often a token was already written
    presence_penalty: float = 0.0    #: -2..2 (OpenAI's): once a token was already written
    export_folder: str = ""          #: where Export… saved last (its dialog opens there)
    models_defaulted: list[str] = field(default_factory=list)  #: models given SMALL_MODEL_DEFAULTS once (keys)
    mcp_servers: list[str] = field(default_factory=list)   #: MCP servers whose tools the model may call (commands/URLs)
    trusted_tools: list[str] = field(default_factory=list)  #: tools that run without asking ("tool (server)")
    #: when the next turn would not fit the context: "drop_oldest" leaves the oldest turns out, "summarise"
    #: has the model summarise them into a short note kept in the context (app/chat/summary.py)
    context_policy: str = "drop_oldest"
    #: patches an attached image may have (its cost: a quarter as many prompt positions); 0 = the default every
    #: front end uses (app.vision.image.DEFAULT_PATCH_BUDGET, as `ferry run --image-budget` and the server's)
    image_patch_budget: int = 0

    def validated(self) -> "Settings":
        """A copy with every value clamped into its legal range."""
        s = Settings(**asdict(self))
        s.ram_budget = max(0, int(s.ram_budget))
        s.threads = max(0, int(s.threads))
        s.temperature = min(max(0.0, float(s.temperature)), 5.0)
        s.top_p = min(max(0.01, float(s.top_p)), 1.0)
        s.top_k = max(0, int(s.top_k))
        s.min_p = min(max(0.0, float(s.min_p)), 0.99)
        s.context_length = min(max(256, int(s.context_length)), 1 << 20)
        s.max_tokens = min(max(1, int(s.max_tokens)), 1 << 20)
        s.model_folders = [str(f) for f in s.model_folders if str(f).strip()]
        s.engine = s.engine if s.engine in ENGINES else "local"
        s.remote_url = str(s.remote_url).strip()
        s.remote_model = str(s.remote_model).strip()
        s.serve_local = bool(s.serve_local)
        s.verify_reads = bool(s.verify_reads)
        # "exact" is the user's choice; anything else is the default. Files written before the default
        # changed hold "f32" (the old default, saved whether chosen or not) or "q8" (now what auto does).
        s.activations = EXACT if s.activations == EXACT else DEFAULT_ACTIVATIONS
        s.serve_port = min(max(1, int(s.serve_port)), 65535)
        s.enter_sends = bool(s.enter_sends)
        # anything but a positive count means the model's own (never a silent, drastic 1)
        s.experts_per_token = None if s.experts_per_token in (None, "") or int(s.experts_per_token) < 1 \
            else int(s.experts_per_token)
        s.cache_aware_margin = min(max(0.0, float(s.cache_aware_margin)), 10.0)
        s.seed = None if s.seed in (None, "") or int(s.seed) < 0 else min(int(s.seed), MAX_SEED)
        s.token_probabilities = bool(s.token_probabilities)
        s.frequency_penalty = min(max(-2.0, float(s.frequency_penalty)), 2.0)
        s.presence_penalty = min(max(-2.0, float(s.presence_penalty)), 2.0)
        s.token_alternatives = min(max(0, int(s.token_alternatives)), MAX_ALTERNATIVES)
        s.export_folder = str(s.export_folder or "")
        s.image_patch_budget = max(0, int(s.image_patch_budget or 0))   # the pipeline clamps it to its range
        s.context_policy = s.context_policy if s.context_policy in CONTEXT_POLICIES else "drop_oldest"
        s.models_defaulted = [str(x) for x in (s.models_defaulted if isinstance(s.models_defaulted, list) else [])]
        s.mcp_servers = list(dict.fromkeys(str(x).strip() for x in (s.mcp_servers if isinstance(s.mcp_servers, list)
                                                                       else []) if str(x).strip()))
        s.trusted_tools = sorted({str(x) for x in (s.trusted_tools if isinstance(s.trusted_tools, list) else [])
                                  if str(x).strip()})
        s.stop = [str(x)[:MAX_STOP_CHARS] for x in (s.stop if isinstance(s.stop, list) else []) if str(x)][:MAX_STOPS]
        s.model_settings = {str(k): _per_model(v) for k, v in dict(s.model_settings or {}).items()
                            if isinstance(v, dict)}
        s.presets = {str(k).strip(): _per_model(v) for k, v in dict(s.presets or {}).items()
                     if isinstance(v, dict) and str(k).strip()}
        return s


#: What each model may have its own value of (and what a preset holds).
PER_MODEL = ("system_prompt", "temperature", "context_length", "thinking", "experts_per_token", "cache_aware_margin",
             "activations", "presence_penalty")

#: A model this small on disk (a dense model up to about 1.5 B parameters at 4 bits) is a "small model"...
SMALL_MODEL_BYTES = 1 << 30
#: ... and gets these per-model values the first time it opens (shown, and changeable, in Model → Settings for
#: this model…): greedy with a presence penalty against loops. Measured with bench/factual_defaults.py on the
#: demo model (20 short factual questions): greedy 14/20, greedy with presence 0.3 14/20, the window's old
#: 0.7 with min-p 0.05 42/60 (3 seeds), 0.5 with min-p 0.1 66/100 (5 seeds); docs/bench-log/2026-12-06.md,
#: "H7: per-model sampling defaults".
SMALL_MODEL_DEFAULTS = {"temperature": 0.0, "presence_penalty": 0.3}


def first_open(settings: Settings, model: str, size_bytes: int) -> Settings:
    """``settings`` after ``model`` (its key) opened: a small model gets SMALL_MODEL_DEFAULTS as its own
    values the first time (never again, so a reset sticks; values the user gave it first win), unless the
    user chose their own general sampling (a temperature or presence penalty other than the defaults)."""
    factory = Settings()
    if model in settings.models_defaulted or (settings.temperature, settings.presence_penalty) != \
            (factory.temperature, factory.presence_penalty):
        return settings
    s = Settings(**asdict(settings))
    s.models_defaulted = [*s.models_defaulted, model]
    if 0 < size_bytes < SMALL_MODEL_BYTES:
        s = set_model_values(s, model, {**SMALL_MODEL_DEFAULTS, **(settings.model_settings.get(model) or {})})
    return s


def _per_model(values: dict) -> dict:
    """Only the PER_MODEL keys of ``values``, each clamped as Settings.validated does."""
    known = {k: v for k, v in values.items() if k in PER_MODEL}
    checked = Settings(**known).validated()
    return {k: getattr(checked, k) for k in known}


def for_model(settings: Settings, model: str) -> Settings:
    """The settings in effect for ``model`` (its key: the container path): the
    global ones with the model's own values on top."""
    own = settings.model_settings.get(model) or {}
    return Settings(**{**asdict(settings), **own}).validated() if own else settings


def model_values(settings: Settings, model: str) -> dict:
    """The PER_MODEL values in effect for ``model``."""
    eff = for_model(settings, model)
    return {k: getattr(eff, k) for k in PER_MODEL}


def set_model_values(settings: Settings, model: str, values: dict | None) -> Settings:
    """A copy where ``model`` has its own ``values`` (None: back to the defaults, the global settings)."""
    s = Settings(**asdict(settings))
    s.model_settings = dict(s.model_settings)
    if values is None:
        s.model_settings.pop(model, None)
    else:
        s.model_settings[model] = _per_model(values)
    return s.validated()


def active_preset(settings: Settings, model: str) -> str | None:
    """The preset in effect for ``model``: the first (by name) whose every value is what the model uses."""
    values = model_values(settings, model)
    return next((name for name, p in sorted(settings.presets.items())
                 if p and all(values.get(k) == v for k, v in p.items())), None)


def save_preset(settings: Settings, name: str, values: dict) -> Settings:
    name = name.strip()
    if not name:
        raise ValueError("a preset needs a name")
    s = Settings(**asdict(settings))
    s.presets = {**s.presets, name: _per_model(values)}
    return s.validated()


def engine_changed(old: Settings, new: Settings) -> bool:
    """Whether the engine must be reopened: what the local model opens with, or which engine."""
    keys = ("ram_budget", "threads", "context_length", "engine", "remote_url", "remote_model", "verify_reads",
            "activations")
    return any(getattr(old, k) != getattr(new, k) for k in keys)


def _api_key_user(url: str) -> str:
    return f"api-key {url.strip().rstrip('/')}"


def remote_api_key(url: str) -> str | None:
    """The API key kept in the keychain for this server, or None (none kept, or no keychain)."""
    if not url.strip():
        return None
    try:
        import keyring

        return keyring.get_password(KEYCHAIN_SERVICE, _api_key_user(url)) or None
    except Exception:  # no usable keychain backend: the server is used without a key
        return None


def set_remote_api_key(url: str, key: str | None) -> None:
    """Keep (or with an empty key, forget) this server's API key in the keychain.

    Raises RuntimeError when there is no usable keychain: the key is never
    written anywhere else."""
    from app.store.crypto import keychain_problem

    problem = keychain_problem()
    if problem:
        raise RuntimeError(f"the API key cannot be kept: {problem}")
    import keyring

    user = _api_key_user(url)
    try:
        if key:
            keyring.set_password(KEYCHAIN_SERVICE, user, key)
        elif keyring.get_password(KEYCHAIN_SERVICE, user) is not None:
            keyring.delete_password(KEYCHAIN_SERVICE, user)
    except Exception as exc:
        raise RuntimeError(f"the keychain failed: {exc}") from exc


#: The keychain entry of the key the window's server asks of its clients.
SERVED_KEY_USER = "api-key served"
_session_key: list[str] = []     #: without a usable keychain: a key for this session only


def served_api_key() -> str:
    """The API key the window's server (*Settings → Serve the loaded model*) asks of its clients:
    kept in the keychain, made the first time it is needed. Without a usable keychain, a key for
    this session only (shown in the settings, never written anywhere)."""
    import secrets

    from app.store.crypto import keychain_problem

    if not keychain_problem():
        try:
            import keyring

            key = keyring.get_password(KEYCHAIN_SERVICE, SERVED_KEY_USER)
            if not key:
                key = "ferry-" + secrets.token_urlsafe(24)
                keyring.set_password(KEYCHAIN_SERVICE, SERVED_KEY_USER, key)
            return key
        except Exception:   # noqa: BLE001 - a keychain that fails: this session's key
            pass
    if not _session_key:
        _session_key.append("ferry-" + secrets.token_urlsafe(24))
    return _session_key[0]


def settings_path() -> Path:
    return paths.config_dir() / FILE_NAME


def load(path: Path | None = None, *, cipher: "Cipher | None" = None) -> Settings:
    """The saved settings; defaults for anything missing or unreadable.

    Settings that hold the user's own text (:data:`PRIVATE_FIELDS`) are kept
    encrypted with the history's key: pass the open history's ``cipher`` to
    read them; without it (or with another key) they are left at their defaults."""
    path = path or settings_path()
    data = _read(path)
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in data.items() if k in known}
    sealed = data.get(ENCRYPTED_KEY)
    if cipher is not None and isinstance(sealed, dict):
        for name, blob in sealed.items():
            if name in PRIVATE_FIELDS and name in known and isinstance(blob, str):
                try:
                    values[name] = json.loads(cipher.decrypt(base64.b64decode(blob), _aad(name)))
                except (ValueError, WrongKey):
                    pass  # damaged or another key's: that one setting is back at its default
    elif cipher is None:
        for name in PRIVATE_FIELDS:
            values.pop(name, None)
    try:
        return Settings(**values).validated()
    except (TypeError, ValueError):
        return Settings()


def save(settings: Settings, path: Path | None = None, *, cipher: "Cipher | None" = None) -> Path:
    """Write atomically (a crash never leaves half a file), readable by the user only.

    With ``cipher`` the :data:`PRIVATE_FIELDS` are written encrypted; without
    it they are not written at all: whatever the file already held for them
    is kept as it was, so nothing is lost and no user text is ever written in
    the clear."""
    path = path or settings_path()
    private_dir(path.parent)
    doc = asdict(settings.validated())
    for name in PRIVATE_FIELDS:
        doc.pop(name, None)
    if cipher is not None:
        plain = asdict(settings)
        doc[ENCRYPTED_KEY] = {name: base64.b64encode(cipher.encrypt(json.dumps(plain[name]), _aad(name))).decode()
                              for name in sorted(PRIVATE_FIELDS) if name in plain}
    else:
        old = _read(path)
        if isinstance(old.get(ENCRYPTED_KEY), dict):
            doc[ENCRYPTED_KEY] = old[ENCRYPTED_KEY]
        for name in PRIVATE_FIELDS:   # a file from before encryption: kept until a key can seal it
            if name in old:
                doc[name] = old[name]
    write_private(path, json.dumps(doc, indent=1))
    return path


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _aad(name: str) -> str:
    return f"settings:{name}"
