"""The vision quickstart's task: count the shapes drawn in a picture.

A picture is a grid of :data:`GRID` x :data:`GRID` cells of :data:`CELL` pixels, the size of
one image token of the tiny model (one merged patch); 1 to :data:`MAX_SHAPES` of its cells
hold a shape (a circle, a square or a triangle, of a random colour, size and place within its
cell) on a light field. A prompt asks ``<image>How many shapes are in the picture?``; a
response is the line ``Answer: N``, read by the same rule as the arithmetic quickstart's
(:func:`plugrl.rewards.answers.parse_answer`).

The warm-start examples are imperfect on purpose: a picture of many shapes
(:data:`MANY_SHAPES` or more) is, with some probability, labelled one short (the last shape
missed). A model trained on them reads the picture, names the right count of many shapes
now and then and greedily the count one short. Reinforcement learning has a clear thing to
learn: count them all.
"""

from __future__ import annotations

import colorsys
import io
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

DATA_SOURCE = "plugrl/counting"
ABILITY = "counting"
QUESTION = "<image>How many shapes are in the picture?"

CELL = 28
"""Pixels of a grid cell: one merged patch of the tiny model (patch 14, merge 2)."""
GRID = 3
"""Cells per side: a picture is 84 x 84 pixels, 9 image tokens."""
MAX_SHAPES = 5
MANY_SHAPES = 4
"""Counts from here up are the ones the warm start teaches to miscount."""
KINDS = ("circle", "square", "triangle")
BACKGROUND = (235, 235, 230)


@attrs.frozen
class Shape:
    """One shape in its cell: ``cell`` in row-major order, ``size`` its width in pixels,
    ``dx``/``dy`` its offset from the cell's corner."""

    cell: int
    kind: str
    color: tuple[int, int, int]
    size: int
    dx: int
    dy: int


@attrs.frozen
class Scene:
    """A picture's shapes; :attr:`count` is the answer."""

    shapes: tuple[Shape, ...]

    @property
    def count(self) -> int:
        return len(self.shapes)

    @property
    def many(self) -> bool:
        """Whether the warm start teaches to miscount this picture."""
        return self.count >= MANY_SHAPES


def random_scene(rng: random.Random, count: int) -> Scene:
    """``count`` shapes in distinct random cells, each of a random kind, colour, size and
    place."""
    shapes = []
    for cell in sorted(rng.sample(range(GRID * GRID), count)):
        size = rng.randint(12, 22)
        # saturated colours, dark enough to stand out from the light field
        rgb = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.6, 1.0), rng.uniform(0.35, 0.75))
        color = tuple(round(255 * channel) for channel in rgb)
        shapes.append(
            Shape(
                cell=cell,
                kind=rng.choice(KINDS),
                color=color,  # type: ignore[arg-type]
                size=size,
                dx=rng.randint(1, CELL - size - 1),
                dy=rng.randint(1, CELL - size - 1),
            )
        )
    return Scene(tuple(shapes))


def draw(scene: Scene) -> Any:
    """The scene as an RGB ``PIL.Image`` of ``GRID * CELL`` pixels a side."""
    from PIL import Image, ImageDraw

    side = GRID * CELL
    image = Image.new("RGB", (side, side), BACKGROUND)
    pen = ImageDraw.Draw(image)
    for shape in scene.shapes:
        row, column = divmod(shape.cell, GRID)
        left, top = column * CELL + shape.dx, row * CELL + shape.dy
        right, bottom = left + shape.size, top + shape.size
        if shape.kind == "circle":
            pen.ellipse((left, top, right, bottom), fill=shape.color)
        elif shape.kind == "square":
            pen.rectangle((left, top, right, bottom), fill=shape.color)
        else:
            pen.polygon(
                [((left + right) / 2, top), (right, bottom), (left, bottom)], fill=shape.color
            )
    return image


def png_bytes(scene: Scene) -> bytes:
    """The scene drawn and encoded as PNG (the same bytes for the same scene)."""
    buffer = io.BytesIO()
    draw(scene).save(buffer, format="PNG")
    return buffer.getvalue()


@attrs.frozen
class CountingSplits:
    """Scenes drawn independently for ``warm_start`` (supervised examples), ``train`` (RL
    prompts) and ``val`` (held out); no picture of one split is in another."""

    warm_start: list[Scene]
    train: list[Scene]
    val: list[Scene]


def make_splits(
    seed: int, *, num_warm_start: int, num_train: int, num_val: int, many_fraction: float
) -> CountingSplits:
    """Draw the splits; ``many_fraction`` of each split's pictures hold :data:`MANY_SHAPES` or
    more shapes (the ones the warm-started model usually miscounts), the others fewer, the
    counts uniform within each part."""
    if not 0.0 <= many_fraction <= 1.0:
        raise ValueError(f"many_fraction must be within [0, 1], got {many_fraction}")
    rng = random.Random(seed)
    seen: set[Scene] = set()

    def draw_split(size: int) -> list[Scene]:
        num_many = round(size * many_fraction)
        counts = [rng.randint(MANY_SHAPES, MAX_SHAPES) for _ in range(num_many)]
        counts += [rng.randint(1, MANY_SHAPES - 1) for _ in range(size - num_many)]
        rng.shuffle(counts)
        scenes = []
        for count in counts:
            scene = random_scene(rng, count)
            while scene in seen:  # astronomically rare, but a held-out picture stays held out
                scene = random_scene(rng, count)
            seen.add(scene)
            scenes.append(scene)
        return scenes

    return CountingSplits(
        val=draw_split(num_val), warm_start=draw_split(num_warm_start), train=draw_split(num_train)
    )


def warm_start_examples(
    scenes: Sequence[Scene], seed: int, *, miscount_probability: float
) -> list[tuple[Scene, str]]:
    """(scene, response) pairs; a picture of many shapes is labelled one short with the given
    probability."""
    rng = random.Random(seed)
    examples = []
    for scene in scenes:
        miss = scene.many and rng.random() < miscount_probability
        examples.append((scene, answer_text(scene.count - 1 if miss else scene.count)))
    return examples


def answer_text(count: int) -> str:
    return f"Answer: {count}"


def image_name(split: str, index: int) -> str:
    """Where a row's picture is also saved as a file, relative to the data folder."""
    return f"images/{split}/{index:05d}.png"


def verl_rows(scenes: Sequence[Scene], split: str) -> list[dict[str, Any]]:
    """Rows in verl's multimodal parquet layout: the ``<image>`` placeholder in the prompt,
    the picture's PNG bytes in the ``images`` column; ``extra_info.image`` names the picture's
    file beside the parquet file (for reading the samples dump)."""
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": QUESTION}],
            "images": [{"bytes": png_bytes(scene), "path": None}],
            "ability": ABILITY,
            "reward_model": {"style": "rule", "ground_truth": str(scene.count)},
            "extra_info": {
                "split": split,
                "index": index,
                "many": scene.many,
                "image": image_name(split, index),
            },
        }
        for index, scene in enumerate(scenes)
    ]


def write_split(scenes: Sequence[Scene], split: str, data_dir: Path) -> Path:
    """``data_dir/<split>.parquet`` and each picture as ``data_dir/images/<split>/N.png``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = verl_rows(scenes, split)
    for row in rows:
        path = data_dir / row["extra_info"]["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(row["images"][0]["bytes"])
    path = data_dir / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
