from engine.models.registry import TEXT_PARTS, VISION_ARCHITECTURES
from engine.vision.load import families


def test_every_vision_family_is_listed_as_seeing_images_and_its_text_part_loads():
    # The catalog says "sees images" from the registry's list; load_vision builds from
    # engine/vision's table: the two name the same classes.
    assert sorted(families()) == sorted(VISION_ARCHITECTURES)
    assert set(VISION_ARCHITECTURES) <= set(TEXT_PARTS)
