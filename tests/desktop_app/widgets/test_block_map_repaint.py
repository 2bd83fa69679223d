"""The block map repaints only the cells whose state changed, and paints only the cells
inside the region it is asked to repaint."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QRect
from PySide6.QtGui import QRegion

from desktop_app.widgets.block_map import BlockMap
from engine.core.kv_stats import BlockInfo

NUM_BLOCKS = 2048


class PaintRegions(QObject):
    """Records the region of each paint event the map receives."""

    def __init__(self) -> None:
        super().__init__()
        self.regions: list[QRegion] = []

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Paint:
            self.regions.append(QRegion(event.region()))
        return False


def _blocks(used: set[int]) -> list[BlockInfo]:
    return [BlockInfo(i, "used" if i in used else "free", int(i in used),
                      (f"r:{i}",) if i in used else ()) for i in range(NUM_BLOCKS)]


def _shown_map(qtbot, qapp) -> tuple[BlockMap, PaintRegions]:
    block_map = BlockMap()
    qtbot.addWidget(block_map)
    block_map.resize(256, 220)
    block_map.set_blocks(_blocks({0, 1, 2}))
    block_map.show()
    qtbot.waitExposed(block_map)
    qapp.processEvents()
    recorder = PaintRegions()
    block_map.installEventFilter(recorder)
    return block_map, recorder


def _painted(qtbot, qapp, recorder: PaintRegions) -> QRegion:
    """The union of the paints the map received once it was asked to repaint."""
    qtbot.waitUntil(lambda: bool(recorder.regions), timeout=2000)
    qapp.processEvents()
    painted = QRegion()
    for region in recorder.regions:
        painted = painted.united(region)
    return painted


def test_one_changed_block_repaints_only_its_cell(qtbot, qapp):
    block_map, recorder = _shown_map(qtbot, qapp)
    block_map.set_blocks(_blocks({0, 1, 2, 700}))
    assert _painted(qtbot, qapp, recorder) == QRegion(block_map.cell_rect(700))
    assert block_map.blocks[700].state == "used"


def test_an_unchanged_refresh_repaints_nothing(qtbot, qapp):
    block_map, recorder = _shown_map(qtbot, qapp)
    for _ in range(3):
        block_map.set_blocks(_blocks({0, 1, 2}))
    qtbot.wait(50)
    assert recorder.regions == []


def test_a_paint_fills_only_the_rows_it_is_asked_for(qtbot, qapp):
    block_map, _recorder = _shown_map(qtbot, qapp)
    cells = block_map.cells_in(block_map.cell_rect(700))
    assert 700 in cells and len(cells) == block_map._columns(block_map.width())
    assert len(block_map.cells_in(QRect(0, 0, 256, 220))) == NUM_BLOCKS


def test_a_pool_of_another_size_repaints_the_whole_map(qtbot, qapp):
    block_map, recorder = _shown_map(qtbot, qapp)
    block_map.set_blocks(_blocks(set())[:100])
    qtbot.waitUntil(lambda: bool(recorder.regions), timeout=2000)
    assert recorder.regions[-1].boundingRect() == block_map.rect()


def test_an_image_mark_repaints_its_cell_and_shows_in_the_tooltip(qtbot, qapp):
    block_map, recorder = _shown_map(qtbot, qapp)
    blocks = _blocks({0, 1, 2})
    blocks[1] = BlockInfo(1, "used", 1, ("r:1",), image=True)
    block_map.set_blocks(blocks)
    assert _painted(qtbot, qapp, recorder) == QRegion(block_map.cell_rect(1))
    assert "Holds an image's tokens" in block_map.tooltip_for(blocks[1])
    assert "image" not in block_map.tooltip_for(blocks[0])
