"""Issue 32: a hostile hub or mirror (HF_ENDPOINT). Names it lists are joined
only inside --into, what it says is escaped before it is shown, and every
wait on it has a deadline and every answer a size limit: a hub that says
nothing, answers a byte at a time, ignores Range and streams forever, or
sends a "small" file far past its listed size gets a one-line error in
bounded time, never a hang or a growing process."""
from __future__ import annotations

import time

import pytest

from app.get.hub import GetError
from app.get.pipeline import Getter
from app.get.plan import plan_repo
from app.memory.budget import MachineMemory
from tests.conftest import run_ferry
from tests.security.conftest import hub_env as _env
from tests.wizard.conftest import T, wizard  # noqa: F401  (the wizard fixture)

BIG = MachineMemory(64 << 30, 64 << 30, "test")


def _outside(tmp_path, into):
    """Every file under tmp_path that is not under ``into`` (nor the hub's home)."""
    return sorted(str(p) for p in tmp_path.rglob("*") if p.is_file() and into not in p.parents
                  and "hf-home" not in p.parts)


@pytest.mark.parametrize("name", ["ABS", "../../../pwned-dotdot.gguf", "sub/../../pwned-sub.gguf",
                                  "sub/../..", "..", "a\\..\\..\\win.gguf", "sub/\x1b]0;owned\x07.gguf"])
def test_a_listed_name_that_leaves_the_folder_is_refused_and_nothing_is_written(evil, repos, tmp_path, name):
    gguf = (repos["gguf"] / "tiny-Q8_0.gguf").read_bytes()
    if name == "ABS":
        name = str(tmp_path / "abs.gguf")
    folder = tmp_path / "empty"
    folder.mkdir()
    evil.add("evil/names", folder, listed={name: gguf, "README.md": b"hi"})
    into = tmp_path / "deep" / "er" / "into"
    before = _outside(tmp_path, into)
    for args in (["--plan"], []):
        res = run_ferry("get", "evil/names", "--into", str(into), *args, check=False, env=_env(evil),
                        timeout=120)
        assert res.returncode == 1, res.stderr
        err = [line for line in res.stderr.splitlines() if line.startswith("ferry: error")]
        assert len(err) == 1 and "refused" in err[0], res.stderr
        assert "Traceback" not in res.stderr and "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert _outside(tmp_path, into) == before
    assert not (tmp_path / "abs.gguf").exists() and not list(tmp_path.parent.glob("pwned*"))


def test_terminal_escapes_in_what_the_hub_says_are_shown_escaped(evil, repos, tmp_path):
    gguf = (repos["gguf"] / "tiny-Q8_0.gguf").read_bytes()
    folder = tmp_path / "empty"
    folder.mkdir()
    evil.add("evil/escapes", folder, listed={"\x1b[2J\x1b[31mPWNED\x1b]0;owned-title\x07.gguf": gguf})
    res = run_ferry("get", "evil/escapes", "--plan", "--into", str(tmp_path / "into"), check=False,
                    env=_env(evil), timeout=120)
    assert res.returncode == 1
    assert "\x1b" not in res.stderr + res.stdout and "\x07" not in res.stderr + res.stdout
    assert "\\x1b[2J" in res.stderr


def test_a_repository_name_that_climbs_is_refused_before_any_folder_is_made(evil, tmp_path):
    into = tmp_path / "into"
    with pytest.raises(GetError, match="not a repository name"):
        Getter("evil/..", into).run()
    assert not into.exists()


@pytest.mark.parametrize("mode", ["silent", "loris-headers", "loris-body", "forever"])
def test_a_file_list_that_stalls_or_never_ends_is_given_up_on(evil, repos, tmp_path, mode):
    evil.add("meta/tiny-llama", repos["llama"], behave={"api": mode})
    t0 = time.monotonic()
    with pytest.raises(GetError) as err:
        plan_repo("meta/tiny-llama", into=tmp_path, memory=BIG, disk_bps=1e9, kernel_bps=1e9)
    elapsed = time.monotonic() - t0
    assert elapsed < 15, elapsed
    assert "\n" not in str(err.value)
    assert any(w in str(err.value) for w in ("did not answer", "stopped answering", "too long", "more than"))
    if mode == "forever":       # cut off at the listing limit, not grown without end
        from app.get.hub import LISTING_LIMIT
        assert evil.sent["api"] < LISTING_LIMIT + (64 << 20)


def test_the_cli_gives_up_on_a_silent_hub_with_one_line(evil, repos, tmp_path):
    evil.add("meta/tiny-llama", repos["llama"], behave={"api": "silent"})
    t0 = time.monotonic()
    res = run_ferry("get", "meta/tiny-llama", "--plan", "--into", str(tmp_path), check=False, env=_env(evil),
                    timeout=60)
    assert time.monotonic() - t0 < 40
    assert res.returncode == 1
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and ("did not answer" in errors[0] or "stopped answering for 0.5 s" in errors[0])
    assert "Traceback" not in res.stderr


def test_a_small_file_far_past_its_listed_size_is_refused_while_reading(evil, repos, tmp_path):
    evil.add("meta/tiny-llama", repos["llama"], behave={"config.json": "huge"})
    t0 = time.monotonic()
    with pytest.raises(GetError, match="more than the .* bytes"):
        plan_repo("meta/tiny-llama", into=tmp_path, memory=BIG, disk_bps=1e9, kernel_bps=1e9)
    assert time.monotonic() - t0 < 15
    assert evil.sent["config.json"] < 64 << 20          # dropped at the limit, not read to the end


def test_a_stalled_small_file_and_header_are_given_up_on(evil, repos, tmp_path):
    shard = sorted(p.name for p in repos["llama"].glob("*.safetensors"))[0]
    for behave in ({"config.json": "loris-body"}, {shard: "silent"}, {shard: "loris-headers"}):
        evil.add("meta/tiny-llama", repos["llama"], behave=behave)
        t0 = time.monotonic()
        with pytest.raises(GetError):
            plan_repo("meta/tiny-llama", into=tmp_path / "p", memory=BIG, disk_bps=1e9, kernel_bps=1e9)
        assert time.monotonic() - t0 < 15, behave


def test_a_hub_that_ignores_range_and_streams_forever_is_read_only_as_far_as_asked(evil, repos, tmp_path):
    """The header reads take their bytes and drop the connection; the plan is
    the same as from a well-behaved hub, and the download of the GGUF stops at
    its listed size (its hash then checks it)."""
    shard = sorted(p.name for p in repos["llama"].glob("*.safetensors"))[0]
    evil.add("meta/tiny-llama", repos["llama"], behave={shard: "forever"})
    plan = plan_repo("meta/tiny-llama", into=tmp_path, memory=BIG, disk_bps=1e9, kernel_bps=1e9)
    assert not plan.problems and plan.verdict
    assert 0 < evil.sent[shard] < 64 << 20
    evil.add("someone/tiny-gguf", repos["gguf"], behave={"tiny-F32.gguf": "forever"})
    out = Getter("someone/tiny-gguf", tmp_path / "into", file="tiny-F32.gguf", memory=BIG).run()
    assert (out / "manifest.json").is_file()
    assert (tmp_path / "into" / "tiny-gguf" / "tiny-F32.gguf").read_bytes() == \
        (repos["gguf"] / "tiny-F32.gguf").read_bytes()


def test_one_escaping_function_for_the_terminal_and_the_window():
    from app.untrusted import shown

    hostile = "a\x1b[2J\x1b]0;t\x07\r\u202eb\u2028c\x9b\n"
    assert shown(hostile) == "a\\x1b[2J\\x1b]0;t\\x07\\x0d\\u202eb\\u2028c\\x9b\\x0a"
    assert shown(hostile, newlines=True).endswith("\n") and shown("plain ünïcode") == "plain ünïcode"
    assert shown(shown(hostile)) == shown(hostile)          # idempotent: escaping twice changes nothing
    assert "\x1b" not in str(GetError(hostile))


def test_gguf_metadata_strings_in_errors_are_escaped(tmp_path):
    from app.convert.arch import spec_from_gguf
    from app.convert.errors import SourceError

    with pytest.raises(SourceError) as info:
        spec_from_gguf({"general.architecture": "\x1b]0;owned\x07"}, set(), str(tmp_path / "x.gguf"))
    assert "\x1b" not in str(info.value) and "\\x1b]0;owned\\x07" in str(info.value)


def test_the_wizard_refuses_a_listed_name_that_leaves_the_folder(qtbot, wizard, evil, repos, tmp_path):  # noqa: F811
    """The wizard runs the same code: the page explains the refusal (escaped), nothing is written outside."""
    gguf = (repos["gguf"] / "tiny-Q8_0.gguf").read_bytes()
    folder = tmp_path / "empty"
    folder.mkdir()
    evil.add("evil/names", folder, listed={"../../pwned-\x1b[31mwizard.gguf": gguf})
    wiz = wizard(remember=False)
    wiz.next()
    wiz.source_page.choose("download")
    dl = wiz.download_page
    dl.into = tmp_path / "deep" / "into"
    dl.plan_kwargs = {"memory": BIG, "disk_bps": 2e9, "kernel_bps": 5e9}
    wiz.next()
    dl.repo_edit.setText("evil/names")
    dl.plan()
    qtbot.waitUntil(lambda: "cannot be downloaded" in dl.plan_text.text(), timeout=T)
    text = dl.plan_text.text()
    assert "refused" in text and "\x1b" not in text and "\\x1b[31m" in text
    assert not dl.start_btn.isEnabled() and not list(tmp_path.rglob("pwned*"))
