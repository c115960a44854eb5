"""The conversion wizard, driven page by page on the real converter: the
demo model into a chat, a DeepSeek-layout checkpoint, stop midway and resume
after closing, a disk without room, a missing or damaged shard."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtWidgets import QWizard

from app.convert.convert import ConvertControl, convert, partial_dir
from app.engine.binding import DEFAULT_READERS
from app.units import size
from tests.wizard.conftest import T, convert_to_end, to_memory, to_source, tree_bytes


def folder(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_demo_model_from_the_model_menu_to_a_chat(qtbot, make_window, demo_gguf, tmp_path):
    w = make_window(None)
    w.convert_action.trigger()                      # Model → Convert a model…
    wiz = w.models.wizard
    assert wiz is not None and wiz.isVisible()
    to_memory(qtbot, wiz, "demo", None, folder(tmp_path / "models"))
    src = wiz.source_page.result.text()
    assert "Everything needed is there" in src and "dense model" in src and "RAM it needs" in src
    assert "reads" in wiz.destination_page.speed.text() and "no experts to stream" in wiz.destination_page.speed.text()
    assert wiz.state.speed is None     # a dense model: the disk probe did not run (issue 16)
    plan = wiz.state.report.plan
    assert wiz.memory_page.budget() == plan.recommended and wiz.state.budget == plan.recommended
    page = wiz.memory_page            # whole MiB, as the labels and the Settings dialog (issue 34)
    assert page.spin.suffix() == " MiB" and page.spin.value() == round(plan.recommended / (1 << 20))
    # The box shows the number the "Recommended" line shows (it once showed 274 beside "273 MiB").
    assert f"<td>{page.spin.value()} MiB (" in page.facts.text() and size(plan.recommended).endswith(" MiB")
    out = convert_to_end(qtbot, wiz)
    assert out == tmp_path / "models" / "smollm2-135m-instruct.ferry"
    assert "The model is ready" in wiz.finish_page.message.text()
    reference = convert(demo_gguf, folder(tmp_path / "reference") / out.name)
    assert tree_bytes(out) == tree_bytes(reference)
    with qtbot.waitSignal(w.model_loaded, timeout=T) as loaded:
        wiz.button(QWizard.WizardButton.FinishButton).click()      # "Open a chat"
    assert loaded.args[0].path == str(out)
    assert w.stack.currentWidget() is w.chat_page
    assert w.settings.ram_budget == 0          # the recommended budget: "auto" in Settings


def test_deepseek_release_layout_converts_to_the_same_bytes(qtbot, wizard, deepseek_ckpt, tmp_path):
    wiz = wizard(remember=False)
    to_memory(qtbot, wiz, "hf", deepseek_ckpt, tmp_path)
    text = wiz.source_page.result.text()
    assert "DeepseekV3ForCausalLM" in text and "16 experts, 4 used per token" in text
    assert "3 files" in text
    speed = wiz.destination_page.speed.text()
    assert "tokens per second" in speed and wiz.state.speed.read_bytes_per_s > 0
    assert f"from {DEFAULT_READERS} readers, as the engine does" in speed and wiz.state.speed.readers == DEFAULT_READERS
    assert wiz.destination_page.name_edit.text() == "deepseek-v3-tiny.ferry"
    out = convert_to_end(qtbot, wiz)
    reference = convert(deepseek_ckpt, folder(tmp_path / "ref") / out.name, trunk_format=wiz.state.trunk_format,
                        expert_format=wiz.state.expert_format)   # the recommended formats
    assert tree_bytes(out) == tree_bytes(reference)
    # The plan shown before converting is the finished container's plan.
    from app.memory.plan import plan_container
    real = plan_container(out, wiz.state.report.plan.n_ctx)
    assert (real.floor, real.recommended) == (wiz.state.report.plan.floor, wiz.state.report.plan.recommended)


def test_stop_midway_close_and_resume_gives_the_same_bytes(qtbot, wizard, synthetic, tmp_path, monkeypatch):
    import app.ui.wizard.convert_page as cp

    reached, release = threading.Event(), threading.Event()
    real = cp.convert

    def held_convert(src, out, *, progress=None, control: ConvertControl | None = None, **kw):
        def hold(p):
            progress(p)
            if not reached.is_set() and p.done_bytes > 0.4 * p.total_bytes:
                reached.set()
                release.wait(30)        # the user's hand is on the mouse now
        return real(src, out, progress=hold, control=control, **kw)

    monkeypatch.setattr(cp, "convert", held_convert)
    wiz = wizard()
    to_memory(qtbot, wiz, "hf", synthetic, tmp_path)
    wiz.next()
    page = wiz.convert_page
    assert wiz.currentPage() is page
    assert reached.wait(30)
    page.pause_btn.click()
    release.set()
    qtbot.waitUntil(lambda: page.latest is not None and page.latest.paused, timeout=T)
    qtbot.waitUntil(lambda: page.speed.text().startswith("Paused"), timeout=T)
    assert "of" in page.amount.text() and "layer" in page.stage.text()
    assert page.pause_btn.text() == "Continue"
    page.stop_btn.click()
    qtbot.waitUntil(lambda: not page.running(), timeout=T)
    assert "Stopped" in page.message.text() and page.resume_btn.isVisible()
    assert "kept" in page.message.text()
    out = wiz.state.out
    assert not out.exists() and (partial_dir(out) / "journal.json").exists()
    wiz.reject()                                    # Ferry is closed
    monkeypatch.setattr(cp, "convert", real)

    again = wizard()                               # ... and opened again
    assert again.welcome_page.resume_box.isVisible()
    assert synthetic.name in again.welcome_page.resume_text.text()
    again.welcome_page.resume_btn.click()
    qtbot.waitUntil(again.source_page.isComplete, timeout=T)
    again.next()
    qtbot.waitUntil(again.destination_page.isComplete, timeout=T)
    assert again.destination_page.out_path() == out
    assert "stopped at" in again.destination_page.space.text()
    again.next()
    assert again.currentPage() is again.memory_page and again.state.budget == wiz.state.budget
    again.next()
    seen = []
    page2 = again.convert_page
    qtbot.waitUntil(lambda: page2.latest is not None and (seen.append(page2.latest) or True), timeout=T)
    assert seen[0].start_bytes > 0.3 * seen[0].total_bytes          # it resumed, it did not start over
    qtbot.waitUntil(lambda: again.currentPage() is again.finish_page, timeout=T)
    qtbot.waitUntil(again.finish_page.isComplete, timeout=T)
    reference = convert(synthetic, folder(tmp_path / "ref") / out.name, trunk_format=again.state.trunk_format,
                        expert_format=again.state.expert_format)   # the recommended formats
    assert tree_bytes(out) == tree_bytes(reference)
    from app.ui.wizard import pending
    assert pending.load() is None


def test_a_destination_without_room_is_refused_before_converting(qtbot, wizard, synthetic, small_tmpfs):
    wiz = wizard(remember=False)
    to_source(qtbot, wiz, "hf", synthetic)
    wiz.next()
    wiz.destination_page.set_folder(small_tmpfs)
    text = wiz.destination_page.space.text()
    assert "Not enough space" in text and "MiB free" in text
    assert not wiz.destination_page.isComplete()
    assert not wiz.button(QWizard.WizardButton.NextButton).isEnabled()
    qtbot.wait(300)
    assert list(small_tmpfs.iterdir()) == []       # nothing written, not even the disk probe


def _without(src: Path, dst: Path, skip: str) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name != skip:
            (dst / f.name).symlink_to(f)
    return dst


def test_a_missing_shard_is_named(qtbot, wizard, deepseek_ckpt, tmp_path):
    broken = _without(deepseek_ckpt, tmp_path / "broken", "model-00002-of-00003.safetensors")
    wiz = wizard(remember=False)
    to_source(qtbot, wiz, "hf", broken)
    text = wiz.source_page.result.text()
    assert "model-00002-of-00003.safetensors" in text and "missing" in text
    assert not wiz.source_page.isComplete()
    assert not wiz.button(QWizard.WizardButton.NextButton).isEnabled()


def test_a_truncated_shard_and_a_missing_tokenizer_are_both_named(qtbot, wizard, deepseek_ckpt, tmp_path):
    broken = _without(deepseek_ckpt, tmp_path / "broken", "model-00003-of-00003.safetensors")
    (broken / "tokenizer.json").unlink()
    data = (deepseek_ckpt / "model-00003-of-00003.safetensors").read_bytes()
    (broken / "model-00003-of-00003.safetensors").write_bytes(data[: len(data) - 1000])
    wiz = wizard(remember=False)
    to_source(qtbot, wiz, "hf", broken)
    text = wiz.source_page.result.text()
    assert "model-00003-of-00003.safetensors" in text and "ends at byte" in text
    assert "tokenizer" in text
    assert not wiz.source_page.isComplete()


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_an_unsupported_or_wrong_source_says_what_is_wrong(qtbot, wizard, tmp_path, kind):
    if kind == "hf":
        (tmp_path / "config.json").write_text('{"architectures": ["GPTBigCodeForCausalLM"]}')
        path, want = tmp_path, "GPTBigCodeForCausalLM"
    else:
        path = tmp_path / "notes.gguf"
        path.write_text("hello")
        want = "neither a checkpoint folder nor a GGUF file"
    wiz = wizard(remember=False)
    to_source(qtbot, wiz, kind, path)
    assert want in wiz.source_page.result.text() and not wiz.source_page.isComplete()


def test_a_model_larger_than_ram_gets_3_bit_experts_and_the_user_can_choose(qtbot, wizard, synthetic, tmp_path,
                                                                             monkeypatch):
    """On a machine whose RAM holds none of the choices, the Source page plans
    the recommended 3-bit experts (the fewest bytes per token) and the smaller
    q4_0 trunk, says why, and converts exactly what `convert(...,
    trunk_format="q4_0", expert_format="q3_nl")` writes; picking another
    format re-plans for it."""
    import app.memory.plan
    from app.memory.budget import MachineMemory

    monkeypatch.setattr(app.memory.plan, "machine_memory", lambda: MachineMemory(64 << 20, 16 << 20, "test"))
    wiz = wizard(remember=False)
    to_memory(qtbot, wiz, "hf", synthetic, tmp_path)
    page, report = wiz.source_page, wiz.state.report
    assert wiz.state.expert_format == "q3_nl" and report.expert_format == "q3_nl"
    choices = {c.format: c for c in report.expert_choices}
    assert list(choices) == ["auto", "q8_0", "q4_0", "q3_nl", "q2_vq"] and choices["q3_nl"].recommended
    assert not choices["q2_vq"].recommended     # 2 bits: offered to a model that streams, never chosen for the user
    assert not any(c.fits_in_ram for c in choices.values())
    assert report.container_bytes == choices["q3_nl"].container_bytes < choices["auto"].container_bytes / 4
    experts = page.choosers["experts"]
    assert not experts.isHidden() and experts.combo.currentData() == "q3_nl"
    assert "fewest bytes per token" in experts.note.text()
    out = convert_to_end(qtbot, wiz)
    assert wiz.state.trunk_format == "iq4_xs" and report.trunk_format == "iq4_xs"   # the smaller trunk, too
    assert "smallest" in page.choosers["trunk"].note.text()
    reference = convert(synthetic, folder(tmp_path / "ref") / out.name, trunk_format="iq4_xs", expert_format="q3_nl")
    assert tree_bytes(out) == tree_bytes(reference)

    other = wizard(remember=False)
    to_source(qtbot, other, "hf", synthetic)
    other.source_page.choose_format("experts", "q8_0")
    page = other.source_page
    qtbot.waitUntil(lambda: page.shown == page._asked and page.shown[3] == "q8_0", timeout=T)
    assert other.state.expert_format == "q8_0" and other.state.report.container_bytes == choices["q8_0"].container_bytes
    experts = page.choosers["experts"]
    assert experts.combo.currentData() == "q8_0" and "would recommend" in experts.note.text()


def test_a_model_that_fits_gets_the_fastest_experts_within_a_4_bit_error(qtbot, wizard, synthetic):
    """The speed rule (app.convert.format_choices): the fastest choice by this machine's measured kernels whose
    error is at most a 4-bit format's, the exact one listed first, one choice away."""
    from app.convert.format_choices import QUALITY_BOUND

    wiz = wizard(remember=False)
    to_source(qtbot, wiz, "hf", synthetic)
    report = wiz.state.report
    chosen = next(c for c in report.expert_choices if c.recommended)
    assert wiz.state.expert_format == chosen.format and chosen.rule == "speed" and chosen.error <= QUALITY_BOUND
    fastest = max(c.tok_per_s for c in report.expert_choices if c.error <= QUALITY_BOUND)
    assert chosen.tok_per_s * 1.15 >= fastest        # the fastest, or a more accurate one within the margin
    assert report.expert_choices[0].label == "Exact (bf16, no loss)"
    note = wiz.source_page.choosers["experts"].note.text()
    assert "whole model fits in this computer" in note and "fastest" in note
    trunk = wiz.source_page.choosers["trunk"]
    assert wiz.state.trunk_format == "auto" and trunk.combo.currentData() == "auto"
    assert [c.format for c in report.trunk_choices] == ["auto", "iq4_xs", "q4_0"] and report.trunk_choices[0].recommended


def test_an_interrupted_conversion_resumes_with_its_expert_format(qtbot, wizard, synthetic, tmp_path, monkeypatch):
    """The format chosen is part of the note of an unfinished conversion: resuming
    plans (and converts) with it, not with the recommendation of the day."""
    from app.convert.convert import JOURNAL
    from app.engine import speed
    from app.ui.wizard import pending

    # The day's recommendation follows the kernels' measured speed; on a loaded machine q8_0 can come out
    # within the speed margin of q4_0 and be recommended itself. Every format at one rate (memory-bound
    # kernels) makes the smaller q4_0 the recommendation whatever the load.
    monkeypatch.setattr(speed, "kernel_bytes_per_s", lambda fmt, *a, **k: 8e9)

    out = tmp_path / "resumed.ferry"
    partial_dir(out).mkdir()
    (partial_dir(out) / JOURNAL).write_text("{}")
    # q8_0 experts: not the day's recommendation (by speed, q4_0 is), so the note says what it would be
    pending.save("hf", synthetic, out, 0, "q4_0", "q8_0")
    try:
        wiz = wizard()
        assert wiz.welcome_page.resume_box.isVisible()
        wiz.welcome_page.resume_btn.click()
        page = wiz.source_page
        qtbot.waitUntil(page.isComplete, timeout=T)
        assert page.shown[2:] == ("q4_0", "q8_0") and (wiz.state.trunk_format, wiz.state.expert_format) == ("q4_0",
                                                                                                             "q8_0")
        assert wiz.state.report.expert_format == "q8_0" and page.choosers["experts"].combo.currentData() == "q8_0"
        assert "would recommend" in page.choosers["experts"].note.text()
        assert "would recommend" in page.choosers["trunk"].note.text()
    finally:
        pending.clear()
