"""Make the small synthetic videos the VL demo looks at (generated, never downloaded).

``python -m toolrollout.apps.demo_vl.video --out clip.mp4 --seed 3`` writes a few-second MPEG-4
clip whose screen is one plain colour per segment (e.g. red for 0-2 s, blue for 2-4 s...),
with the segment's digit drawn in the corner. The question for such a clip is "which colour
is shown at second T?", answerable only by looking at frames in that window: the task that
``crop_video`` is for.

PyAV encodes with FFmpeg's own ``mpeg4`` encoder, which every PyAV wheel carries.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, cast

__all__ = ["COLOURS", "Segment", "make_video", "plan_segments"]

COLOURS: Final = {
    "red": (220, 30, 30),
    "green": (30, 180, 60),
    "blue": (30, 60, 220),
    "yellow": (230, 210, 30),
}
"""Colour names and their RGB values."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One plain-colour stretch of the clip."""

    start: float
    end: float
    colour: str
    digit: int


def plan_segments(seed: int, *, segments: int = 4, seconds: float = 2.0) -> list[Segment]:
    """The clip's segments for ``seed`` (deterministic)."""
    rng = random.Random(seed)
    names = list(COLOURS)
    out: list[Segment] = []
    for index in range(segments):
        # Neighbours differ, so every segment boundary is visible.
        choices = [n for n in names if not out or n != out[-1].colour]
        out.append(
            Segment(
                start=index * seconds,
                end=(index + 1) * seconds,
                colour=rng.choice(choices),
                digit=rng.randrange(10),
            )
        )
    return out


def make_video(out: str | Path, segments: list[Segment], *, fps: int = 4, size: int = 64) -> Path:
    """Encode ``segments`` as an MPEG-4 clip at ``out``; return its path."""
    import av
    from PIL import Image, ImageDraw

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width = size
        stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.time_base = Fraction(1, fps)
        total = round(segments[-1].end * fps)
        for index in range(total):
            now = index / fps
            segment = next(s for s in segments if s.start <= now < s.end)
            image = Image.new("RGB", (size, size), COLOURS[segment.colour])
            ImageDraw.Draw(image).text((4, 4), str(segment.digit), fill=(255, 255, 255))
            frame = cast(Any, av.VideoFrame).from_image(image)
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fps", type=int, default=4)
    args = parser.parse_args(argv)
    segments = plan_segments(args.seed)
    make_video(args.out, segments, fps=args.fps)
    for segment in segments:
        sys.stdout.write(f"{segment.start:g}-{segment.end:g}s {segment.colour} {segment.digit}\n")


if __name__ == "__main__":
    main()
