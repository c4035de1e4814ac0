"""Models load and save without transformers' progress bars and the warnings known to be
harmless, and everything else transformers says still shows."""

from __future__ import annotations

import warnings

from plugrl.data.hf_loading import quiet_hf_loading
from plugrl.testing import save_tiny_model


def test_a_load_and_a_save_draw_no_progress_bar(tmp_path, capfd):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    folder = save_tiny_model(tmp_path / "model")
    capfd.readouterr()
    assert hf_logging.is_progress_bar_enabled()
    AutoModelForCausalLM.from_pretrained(folder)
    assert "Loading weights" in capfd.readouterr().err  # what a user saw at every start
    with quiet_hf_loading():
        model = AutoModelForCausalLM.from_pretrained(folder)
        model.save_pretrained(tmp_path / "again")
    assert capfd.readouterr().err == ""
    assert hf_logging.is_progress_bar_enabled(), "the bars are back on afterwards"


def test_bars_stay_off_until_the_last_of_nested_uses_ends_and_off_if_they_were():
    from transformers.utils import logging as hf_logging

    with quiet_hf_loading():
        with quiet_hf_loading():
            pass
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with quiet_hf_loading():
            pass
        assert not hf_logging.is_progress_bar_enabled(), "a user's choice is kept"
    finally:
        hf_logging.enable_progress_bar()


def test_only_the_known_harmless_warnings_are_hidden():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_hf_loading():
            warnings.warn(
                "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
                FutureWarning,
                stacklevel=1,
            )
            warnings.warn("a weight was not found in the folder", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a weight was not found in the folder"]
