"""The encrypted history store, the conversation tree, settings and stats."""
from __future__ import annotations

import sqlite3

import keyring
import pytest
from keyring.backends import fail

from app.chat.conversation import SAVE_INTERVAL, Chat, ChatError, recover_interrupted
from app.chat.turn import opening_channel
from app.memory.stats import StatsView, memory_split, recommended_budget, usable_ram
from app.store import settings as settings_mod
from app.store.crypto import EphemeralKeys, KeychainKeys, KeyUnavailable, PassphraseKeys, WrongKey
from app.store.database import KeyFile
from app.store.history import HistoryStore, stored_key_kind

SECRET = "the harbour key is under the blue stone 7731"
TITLE = "zebra-kumquat planning"




def raw_bytes(db) -> bytes:
    out = b""
    for suffix in ("", "-wal", "-journal", "-shm"):
        p = db.parent / (db.name + suffix)
        if p.exists():
            out += p.read_bytes()
    return out


def test_plaintext_never_reaches_the_disk(kr, tmp_path):
    db = tmp_path / "h.sqlite3"
    store = HistoryStore(db, KeychainKeys())
    cid = store.create_conversation(TITLE)
    uid = store.add_message(cid, None, "user", SECRET)
    store.add_message(cid, uid, "assistant", "noted: " + SECRET, thinking="thinking about " + SECRET)
    # while open (the WAL holds the latest writes) and after closing
    for needle in (SECRET, TITLE, "harbour key"):
        assert needle.encode() not in raw_bytes(db)
        assert needle.encode("utf-16-le") not in raw_bytes(db)
    assert (tmp_path / "h.sqlite3-wal").exists()
    store.close()
    assert SECRET.encode() not in raw_bytes(db) and TITLE.encode() not in raw_bytes(db)
    # and it reads back
    store = HistoryStore(db, KeychainKeys())
    assert store.conversation(cid).title == TITLE
    assert [m.content for m in store.messages(cid)] == [SECRET, "noted: " + SECRET]
    assert store.messages(cid)[1].thinking == "thinking about " + SECRET
    store.close()
    assert stored_key_kind(db) == "keychain"
    assert len(kr.items) == 1  # one random key in the keychain, not the passphrase or the text


def test_wrong_key_and_wrong_passphrase_are_refused(tmp_path):
    db = tmp_path / "p.sqlite3"
    store = HistoryStore(db, PassphraseKeys("open sesame"))
    cid = store.create_conversation(TITLE)
    store.add_message(cid, None, "user", SECRET)
    store.close()
    with pytest.raises(WrongKey):
        HistoryStore(db, PassphraseKeys("open sesame!"))
    with pytest.raises(WrongKey):
        HistoryStore(db, EphemeralKeys())
    store = HistoryStore(db, PassphraseKeys("open sesame"))
    assert store.messages(cid)[0].content == SECRET
    salt = KeyFile(db).get("scrypt_salt")      # the salt is in the side file, the file itself is encrypted
    assert len(salt) == 16
    with pytest.raises(sqlite3.DatabaseError):
        sqlite3.connect(db).execute("SELECT value FROM meta").fetchall()
    store.close()
    assert SECRET.encode() not in raw_bytes(db)


def test_no_keychain_never_falls_back_to_plaintext(tmp_path):
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    try:
        with pytest.raises(KeyUnavailable):
            HistoryStore(tmp_path / "x.sqlite3", KeychainKeys())
    finally:
        keyring.set_keyring(before)
    with pytest.raises(ValueError):
        HistoryStore(tmp_path / "y.sqlite3", None)


def test_swapped_ciphertexts_do_not_decrypt(kr, tmp_path):
    db = tmp_path / "s.sqlite3"
    store = HistoryStore(db, KeychainKeys())
    cid = store.create_conversation("t")
    a = store.add_message(cid, None, "user", "first")
    b = store.add_message(cid, a, "assistant", "second")
    con = store._db       # inside the encrypted file, values are still bound to their rows
    blob_a = con.execute("SELECT body FROM messages WHERE id=?", (a,)).fetchone()[0]
    con.execute("UPDATE messages SET body=? WHERE id=?", (blob_a, b))
    con.commit()
    with pytest.raises(WrongKey):
        store.messages(cid)
    store.close()


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_chat_tree_regenerate_edit_switch(kr, tmp_path):
    store = HistoryStore(tmp_path / "t.sqlite3", KeychainKeys())
    chat = Chat(store)
    t = chat.send("What is a ferry?", "Be brief.")
    assert t.messages == [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "What is a ferry?"}]
    with pytest.raises(ChatError):
        chat.send("again")
    chat.append("response", "A boat.")
    chat.finish("stop")
    q1, a1 = chat.visible()
    t2 = chat.regenerate(a1.id)
    assert t2.messages == [{"role": "user", "content": "What is a ferry?"}]
    chat.append("response", "A ship that carries people.")
    chat.finish("stop")
    a2 = chat.visible()[-1]
    assert a2.parent_id == q1.id and [m.id for m in chat.tree.siblings(a2.id)] == [a1.id, a2.id]
    t3 = chat.send("And a barge?")
    assert [m["content"] for m in t3.messages] == ["What is a ferry?", "A ship that carries people.", "And a barge?"]
    chat.finish("stop", "A flat boat.")
    # edit the first question: a new root branch
    t4 = chat.edit(q1.id, "What is a raft?")
    assert t4.messages == [{"role": "user", "content": "What is a raft?"}]
    chat.finish("stop", "Logs tied together.")
    path = chat.visible()
    assert [m.content for m in path] == ["What is a raft?", "Logs tied together."]
    assert [m.id for m in chat.tree.siblings(path[0].id)] == [q1.id, path[0].id]
    # switch back to the first question: its newest branch comes back
    chat.switch_to(q1.id)
    assert [m.content for m in chat.visible()] == ["What is a ferry?", "A ship that carries people.",
                                                   "And a barge?", "A flat boat."]
    chat.switch_to(a1.id)
    assert [m.content for m in chat.visible()] == ["What is a ferry?", "A boat."]
    # reopened from the store: same tree, same branch
    again = Chat(store, chat.id)
    assert [m.id for m in again.visible()] == [q1.id, a1.id]
    assert len(again.tree.by_id) == 7
    md = again.to_markdown()
    assert md.startswith("# What is a ferry?") and "## You" in md and "A boat." in md
    store.close()


def test_streaming_answer_is_saved_every_half_second(kr, tmp_path):
    store = HistoryStore(tmp_path / "w.sqlite3", KeychainKeys())
    clock = FakeClock()
    chat = Chat(store, clock=clock)
    chat.send("hi")
    aid = chat.streaming_id
    chat.append("thinking", "hmm ")
    clock.t += 1.0
    chat.append("response", "Hel")
    assert store.messages(chat.id)[-1].content == "Hel"      # saved: more than SAVE_INTERVAL passed
    assert store.messages(chat.id)[-1].thinking == "hmm "
    clock.t += SAVE_INTERVAL / 10
    chat.append("response", "lo")
    assert store.messages(chat.id)[-1].content == "Hel"      # not yet
    clock.t += SAVE_INTERVAL
    chat.append("response", "!")
    rec = store.messages(chat.id)[-1]
    assert rec.content == "Hello!" and rec.status == "streaming" and rec.thinking_seconds == pytest.approx(1.0)
    # a crash now: the next start marks it stopped, keeping the text
    assert recover_interrupted(store) == 1
    rec = store.messages(chat.id)[-1]
    assert rec.id == aid and rec.status == "cancelled" and rec.content == "Hello!"
    store.close()


def test_search_and_rename(kr, tmp_path):
    store = HistoryStore(tmp_path / "r.sqlite3", KeychainKeys())
    a = Chat(store)
    a.send("Tell me about lighthouses")
    a.finish("stop", "They guide ships.")
    b = Chat(store)
    b.send("Recipe for bread")
    b.finish("stop", "Flour, water, salt.")
    assert [c.id for c in store.search("SHIPS")] == [a.id]
    assert [c.id for c in store.search("bread")] == [b.id]
    b.rename("Baking")
    assert store.conversation(b.id).title == "Baking"
    assert {c.id for c in store.search("")} == {a.id, b.id}
    store.delete_conversation(a.id)
    assert [c.id for c in store.conversations()] == [b.id]
    store.close()


def test_opening_channel():
    assert opening_channel([("<|im_start|>assistant\n<think>\n", True)]) == "thinking"
    assert opening_channel([("q", False), ("<think>\n\n</think>\n\n", True)]) == "response"
    assert opening_channel([("<think>", True), ("q", False), ("assistant:", True)]) == "response"


def test_settings_round_trip(tmp_path):
    p = tmp_path / "cfg" / "settings.json"
    assert settings_mod.load(p) == settings_mod.Settings()
    s = settings_mod.Settings(model_folders=["/models"], ram_budget=3 << 30, threads=4, temperature=0.3,
                              top_p=0.8, top_k=20, min_p=0.1, thinking=False, system_prompt="Be kind.",
                              context_length=8192)
    cipher = HistoryStore(tmp_path / "h.sqlite3", EphemeralKeys()).cipher
    settings_mod.save(s, p, cipher=cipher)
    assert settings_mod.load(p, cipher=cipher) == s
    assert "Be kind" not in p.read_text()   # user text is sealed with the history's key
    p.write_text("{not json")
    assert settings_mod.load(p) == settings_mod.Settings()
    assert settings_mod.settings_path().parent.name == "config"   # FERRY_HOME/config in tests


def _stats(**kw):
    base = dict(prompt_tokens=0, decode_tokens=0, prompt_seconds=0.0, decode_seconds=0.0, expert_reads=0,
                bytes_read=0, read_seconds=0.0, compute_seconds=0.0, hits=0, misses=0)
    base.update(kw)
    return base


def test_stats_view_rates_and_hit_rates():
    v = StatsView(window=10)
    v.push(_stats(prompt_tokens=64, prompt_seconds=0.5, hits=10, misses=30, bytes_read=30_000_000,
                  expert_reads=30), "prefill", t=0.5)
    out = v.push(_stats(prompt_tokens=64, prompt_seconds=0.5, decode_tokens=10, decode_seconds=1.0, hits=100,
                        misses=40, bytes_read=40_000_000, expert_reads=40), "decode", t=1.5)
    assert out.prompt_tps == pytest.approx(128.0)
    assert out.decode_tps == pytest.approx(10.0)
    assert out.hit_prefill == pytest.approx(0.25) and out.hit_decode == pytest.approx(90 / 100)
    assert out.hit_prefill_total == pytest.approx(0.25)
    assert out.read_mbps == pytest.approx(40.0 / 1.5, rel=1e-6)
    assert out.bytes_read_total == 40_000_000 and len(v.history["decode_tps"]) == 2
    # a new session (counters start again) does not produce negative deltas
    out = v.push(_stats(decode_tokens=2, decode_seconds=0.1, hits=1, misses=1), "decode", t=2.0)
    assert out.hit_decode_total == pytest.approx(91 / 102)


def test_stats_view_uses_the_engines_decode_split():
    v = StatsView(window=10)
    out = v.push(_stats(prompt_tokens=32, prompt_seconds=0.2, decode_tokens=3, decode_seconds=0.3, hits=50,
                        misses=50, decode_hits=27, decode_misses=3), "decode", t=1.0)
    assert out.hit_decode == pytest.approx(0.9) and out.hit_prefill == pytest.approx(23 / 70)
    assert out.hit_decode_total == pytest.approx(0.9)


class _Plan:
    trunk_bytes, state_bytes, scratch_bytes, expert_bytes, total_bytes, floor_bytes = 100, 20, 5, 210, 342, 135
    policy_bytes, policy_floor_bytes = 7, 3    # the cache policy's state, in the total and the floor
    record_bytes, token_set_bytes = 5, 10


class _Info:
    n_moe_layers, n_experts, expert_bytes = 2, 8, 50


def test_memory_split():
    from app.memory.budget import APP_RESERVE, MachineMemory
    from app.memory.plan import recommend

    assert usable_ram() > 0
    # the gauge's recommendation is the budget rule's, exactly
    for usable in (APP_RESERVE + 10_000, APP_RESERVE + 400, 100):
        assert recommended_budget(_Plan, usable) == recommend(_Plan, MachineMemory(usable, usable, "t")).budget
    assert recommended_budget(_Plan, 100) == 135                                   # never below the floor
    assert memory_split(_Plan, _Info, 342, usable=10_000, recommended=777).recommended == 777
    m = memory_split(_Plan, _Info, budget=342, usable=10_000)
    assert (m.trunk, m.state, m.scratch, m.expert_cache, m.policy) == (100, 20, 5, 210, 7) and m.total == 342
    assert m.floor == 135 and [n for n, _ in m.parts] == ["trunk", "attention state", "expert cache", "cache policy",
                                                          "scratch"]
