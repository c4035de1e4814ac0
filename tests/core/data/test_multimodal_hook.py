"""The ``multimodal_model`` hook as a third party implements it: the class it returns for its
model type is the one the core builds, and a vision model no plugin answers for, or an answer
that is not a ``MultimodalModel``, stops in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from plugrl import hookimpl
from plugrl.api.data import MultimodalModel
from plugrl.data.multimodal import multimodal_family
from plugrl.errors import DataError


class ToyVisionModel(MultimodalModel):
    """Built by the core; none of its answers is asked for here."""

    def processor(self, tokenizer):
        raise NotImplementedError

    def image_text(self):
        raise NotImplementedError

    def vision_token_ids(self, tokenizer):
        raise NotImplementedError

    def position_ids(self, input_ids, attention_mask, inputs):
        raise NotImplementedError


class ToyFamilies:
    @hookimpl
    def multimodal_model(self, model_type):
        return {"toy_vl": ToyVisionModel, "broken_vl": dict}.get(model_type)


def config(model_type: str) -> SimpleNamespace:
    return SimpleNamespace(model_type=model_type, vision_config={"depth": 1})


@pytest.fixture
def families(plugrl_plugin_manager, plugrl_register_plugin):
    plugrl_register_plugin(ToyFamilies(), "toy-families")
    return plugrl_plugin_manager


def test_the_plugin_answering_for_the_model_type_gives_its_class(families):
    family = multimodal_family("/models/toy", config("toy_vl"), families)
    assert type(family) is ToyVisionModel
    assert family.model_path == "/models/toy"
    # a text model has no family: no plugin is asked
    assert multimodal_family("/models/text", SimpleNamespace(model_type="toy_vl"), families) is None


def test_a_vision_model_no_plugin_knows_is_refused_in_one_line(families):
    with pytest.raises(DataError) as info:
        multimodal_family("/models/other", config("other_vl"), families)
    assert str(info.value) == (
        "model.path is a vision-language model of type 'other_vl', which no installed plugin "
        "supports; install a plugin that implements the multimodal_model hook for it"
    )


def test_an_answer_that_is_not_a_multimodal_model_is_refused_in_one_line(families):
    with pytest.raises(DataError) as info:
        multimodal_family("/models/broken", config("broken_vl"), families)
    assert str(info.value) == (
        "the multimodal_model hook returned <class 'dict'> for 'broken_vl'; it must return a "
        "subclass of plugrl.api.data.MultimodalModel"
    )


def test_the_towers_are_found_at_the_first_path_the_model_has(families):
    from torch import nn

    family = multimodal_family("/models/toy", config("toy_vl"), families)
    inner = nn.Module()
    inner.language_model = nn.Linear(2, 2)
    model = nn.Module()
    model.model = inner
    model.visual = nn.Linear(2, 2)
    assert family.vision_tower(model) is model.visual  # the second path: model.visual is absent
    assert family.language_model(model) is inner.language_model
    with pytest.raises(ValueError) as info:
        family.vision_tower(nn.Linear(2, 2))
    assert str(info.value) == (
        "Linear has none of the submodules model.visual, visual; its model family must name "
        "its vision tower (MultimodalModel.vision_tower_names)"
    )
