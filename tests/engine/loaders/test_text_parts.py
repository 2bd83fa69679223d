"""The Qwen3.5 and Qwen3.5-MoE folders people download: multimodal checkpoints
(Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration: the text model
under model.language_model.*, its LM head beside it, a vision tower), saved here by
transformers with a small vision config. Folio loads the text part, and replies
greedy-equal to transformers' text model on the same weights to text; Qwen3.5's dense
tower is engine/vision's (read, and the list says "sees images"), the MoE's is not run
(never read, and the list says "text only")."""

from __future__ import annotations

import pytest
import safetensors
import torch
import transformers

from engine import LLM, SamplingParams
from engine.loaders.catalog import model_info
from tests.engine.tiny_models import (
    byte_level_tokenizer,
    calm_qwen35_weights,
    random_prompt,
    tiny_qwen35_config,
    tiny_qwen35_moe_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
              patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
# Multimodal class -> (its config class, the text config, the text model's class).
KINDS = {
    "Qwen3_5ForConditionalGeneration": ("Qwen3_5Config", tiny_qwen35_config,
                                        "Qwen3_5ForCausalLM"),
    "Qwen3_5MoeForConditionalGeneration": ("Qwen3_5MoeConfig", tiny_qwen35_moe_config,
                                           "Qwen3_5MoeForCausalLM"),
}
GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module", params=list(KINDS))
def multimodal(request, tmp_path_factory):
    """(the saved folder, transformers' text model holding its text weights)."""
    config_class, make_text, text_class = KINDS[request.param]
    text = make_text().to_dict()
    text.pop("architectures", None)
    config = getattr(transformers, config_class)(text_config=text, vision_config=VISION)
    torch.manual_seed(0)
    model = getattr(transformers, request.param)(config).eval()
    calm_qwen35_weights(model, 0)
    folder = tmp_path_factory.mktemp("multimodal") / request.param
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    reference = getattr(transformers, text_class)(model.config.text_config).eval()
    reference.model.load_state_dict(model.model.language_model.state_dict())
    reference.lm_head.load_state_dict(model.lm_head.state_dict())
    return folder, reference


def test_the_text_part_replies_as_transformers_text_model(multimodal, monkeypatch):
    folder, reference = multimodal
    read: list[str] = []
    real_open = safetensors.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.handle = real_open(*args, **kwargs)

        def __enter__(self):
            self.inner = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Recording)
    prompt = random_prompt(4, 60)
    got = LLM(str(folder), num_gpu_blocks=32).generate([prompt], GREEDY)[0].outputs[0]
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=20,
                                      do_sample=False)[0, len(prompt):].tolist()
    assert list(got.token_ids) == expected
    assert "lm_head.weight" in read  # the untied head beside the text model
    # Qwen3.5's tower is engine/vision's (read by load_vision); Qwen3.5-MoE's is not run.
    visual = [name for name in read if name.startswith("model.visual.")]
    assert bool(visual) == _sees_images(folder)


def _sees_images(folder) -> bool:
    import json

    from engine.models.registry import VISION_ARCHITECTURES

    config = json.loads((folder / "config.json").read_text())
    return bool(set(config["architectures"]) & set(VISION_ARCHITECTURES))


def test_the_list_says_text_only_or_sees_images(multimodal):
    folder, reference = multimodal
    info = model_info(folder)
    assert info.architecture == reference.config.model_type
    kind = "sees images" if _sees_images(folder) else "text only"
    assert info.layer_summary == f"hybrid: 3 linear + 1 full layers, {kind}"
    # The text model's parameters only (the vision tower is counted apart, or not run).
    assert info.num_parameters == sum(p.numel() for p in reference.parameters())
