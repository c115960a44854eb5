"""The rule a new passphrase must meet, and why. No Qt here.

The history's key is derived from the passphrase with scrypt (about a tenth
of a second and 32 MiB per guess); the salt and a check value sit in the
history file. Anyone who can read that file can therefore guess passphrases
offline, as fast as their hardware allows. A passphrase is accepted when
zxcvbn (Dropbox's strength estimator: dictionaries, names, keyboard walks,
dates, repeats, l33t substitutions) estimates at least 10^10 guesses to find
it (its score 4 of 4) -- at a thousand scrypt guesses a second on a large GPU
rig that is over three months. Passphrases of a few unrelated words pass;
``1234``, ``password1`` or a name with a year do not.

The rule applies when a passphrase is chosen, never when one is typed to
open an existing history (that one is what it is).
"""
from __future__ import annotations

import math

MIN_GUESSES_LOG10 = 10.0
#: Longest piece given to the estimator at once: zxcvbn's own limit, ~0.05 s; its time grows
#: faster than the square of the length (200 characters of "a": over a second, 400: 17 s).
_PIECE_CHARS = 72
#: A longer passphrase is estimated piece by piece (each distinct piece once, at most this many).
_MAX_PIECES = 16
#: Longest passphrase taken (a bound on the estimate's time; a sentence is far shorter).
MAX_PASSPHRASE_CHARS = 1024

LOST_PASSPHRASE_WARNING = ("There is no way to recover a lost passphrase: without it your conversations and "
                           "documents cannot be read by anyone, Ferry included. Write it down somewhere safe.")

RULE = ("Choose a passphrase that would take at least 10 billion guesses to find, for example four or more "
        "unrelated words. Common words, names, dates, keyboard patterns and short passwords are refused.")


def passphrase_problem(passphrase: str, context: tuple[str, ...] = ("ferry",)) -> str | None:
    """Why ``passphrase`` is too weak to protect the history, or None when it is strong enough."""
    from zxcvbn import zxcvbn

    if not passphrase:
        return "The passphrase is empty."
    if len(passphrase) > MAX_PASSPHRASE_CHARS:
        return f"The passphrase is longer than {MAX_PASSPHRASE_CHARS} characters, the most Ferry takes."
    guesses_log10, result = _estimate(passphrase, list(context), zxcvbn)
    if guesses_log10 >= MIN_GUESSES_LOG10:
        return None
    feedback = result.get("feedback") or {}
    hints = [feedback.get("warning") or ""] + list(feedback.get("suggestions") or [])
    hints = " ".join(h.strip().rstrip(".") + "." for h in hints if h and h.strip())
    if result.get("password") != passphrase:     # estimated piece by piece: the whole one's crack time
        from zxcvbn.time_estimates import estimate_attack_times

        result = {"crack_times_display": estimate_attack_times(10 ** guesses_log10)["crack_times_display"]}
    crack = (result.get("crack_times_display") or {}).get("offline_slow_hashing_1e4_per_second", "")
    where = f" someone who copies your history file could find it in {crack}" if crack else ""
    return f"This passphrase is too easy to guess:{where}. {hints} {RULE}".replace("  ", " ").strip()


def _period(text: str) -> int:
    """The length of the shortest unit ``text`` repeats ("abcabcab" -> 3; ``len(text)`` when none)."""
    fail = [0] * len(text)       # the prefix function (Knuth-Morris-Pratt), linear time
    k = 0
    for i in range(1, len(text)):
        while k and text[i] != text[k]:
            k = fail[k - 1]
        if text[i] == text[k]:
            k += 1
        fail[i] = k
    return len(text) - fail[-1] if text else 0


def _estimate(text: str, context: list[str], zxcvbn) -> tuple[float, dict]:
    """log10 of the guesses to find ``text``, and the zxcvbn result to explain it with. Up to
    _PIECE_CHARS: zxcvbn on the whole. Longer: a repetition of a unit is the unit's guesses times the
    repetitions (as zxcvbn counts a repeat); otherwise the sum over its distinct pieces, stopping as
    soon as it is enough -- so the time is bounded whatever the length."""
    if len(text) <= _PIECE_CHARS:
        result = zxcvbn(text, user_inputs=context)
        return float(result["guesses_log10"]), result
    unit = _period(text)
    if unit < len(text):
        guesses, result = _estimate(text[:unit], context, zxcvbn)
        return guesses + math.log10(len(text) / unit), result
    total, explain, seen = 0.0, None, set()
    for i in range(0, len(text), _PIECE_CHARS):
        piece = text[i:i + _PIECE_CHARS]
        if piece in seen:
            continue
        seen.add(piece)
        if len(seen) > _MAX_PIECES:
            break
        guesses, result = _estimate(piece, context, zxcvbn)
        total += guesses
        if explain is None or guesses < float(explain["guesses_log10"]):
            explain = result
        if total >= MIN_GUESSES_LOG10:
            break
    return total, explain


#: The environment variable that gives the history's passphrase (for scripts;
#: the window honours it too, the same way).
ENVIRONMENT = "FERRY_PASSPHRASE"


def environment_keys(db_path, environ=None):
    """The history's key when no one needs to be asked, by the one rule every
    front end (the CLI, ``ferry docs``, the window) follows:

    * a history made with a throw-away key is refused (nothing can open it);
    * ``FERRY_PASSPHRASE`` set (whatever the keyring backend) gives a
      ``PassphraseKeys`` for a passphrase history, or for a new one -- which
      is refused (``KeyUnavailable``) when the rule above finds it weak, so
      nothing is created;
    * otherwise None: the keychain, or ask the user (terminal or dialog).

    A history made with a keychain key ignores the variable (it is no key for
    it). A wrong passphrase shows as ``WrongKey`` when the history is opened."""
    import os

    from app.store.crypto import KeyUnavailable, PassphraseKeys
    from app.store.database import stored_key_kind

    kind = stored_key_kind(db_path)
    if kind == "ephemeral":
        raise KeyUnavailable("this history was made with a throw-away key and cannot be opened")
    passphrase = (os.environ if environ is None else environ).get(ENVIRONMENT)
    if not passphrase or kind not in (None, "passphrase"):
        return None
    if kind is None and (problem := passphrase_problem(passphrase)):
        raise KeyUnavailable(f"{ENVIRONMENT} cannot protect a new history: {problem}")
    return PassphraseKeys(passphrase)
