"""image_processing (FunctionBench): Pillow's flip, rotate, filter, gray and resize on an image of
args["width"] × args["height"] (default 640 × 480, at most 2048 × 2048). The input JPEG is
generated on first use into /tmp (nothing is downloaded), as a user's upload would arrive, and
reused by later calls; every result is encoded as JPEG in memory, as FunctionBench saves each.
Returns each operation's output size and mode, and a checksum of the gray image."""

import hashlib
import io
import os
import tempfile
import time

from PIL import Image, ImageDraw, ImageFilter


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


def make_input(w: int, h: int) -> Image.Image:
    """A deterministic photo-like picture: colour gradients with shapes on top."""
    gx = Image.linear_gradient("L").resize((w, h))
    gy = gx.transpose(Image.Transpose.ROTATE_90).resize((w, h))
    img = Image.merge("RGB", (gx, gy, Image.new("L", (w, h), 96)))
    d = ImageDraw.Draw(img)
    for i in range(12):
        x0, y0 = (i * 53) % w, (i * 37) % h
        d.ellipse([x0, y0, x0 + w // 5, y0 + h // 5], fill=(255 - 20 * i, 40 + 15 * i, 128))
        d.line([0, (i * 41) % h, w, h - (i * 41) % h], fill=(0, 0, 0), width=3)
    return img


def input_path(w: int, h: int) -> str:
    path = os.path.join(tempfile.gettempdir(), f"hearth-fb-image-{w}x{h}.jpg")
    if not os.path.exists(path):
        tmp = path + ".%d" % os.getpid()
        make_input(w, h).save(tmp, "JPEG", quality=90)
        os.replace(tmp, path)
    return path


def main(args: dict) -> dict:
    w = _int(args, "width", 640, 8, 2048)
    h = _int(args, "height", 480, 8, 2048)
    path = input_path(w, h)
    t0 = time.perf_counter()
    with Image.open(path) as f:
        img = f.convert("RGB")
    results = {
        "flip_lr": img.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        "flip_tb": img.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
        "rotate_90": img.transpose(Image.Transpose.ROTATE_90),
        "rotate_180": img.transpose(Image.Transpose.ROTATE_180),
        "rotate_270": img.transpose(Image.Transpose.ROTATE_270),
        "blur": img.filter(ImageFilter.BLUR),
        "contour": img.filter(ImageFilter.CONTOUR),
        "sharpen": img.filter(ImageFilter.SHARPEN),
        "gray": img.convert("L"),
        "resize_half": img.resize((max(w // 2, 1), max(h // 2, 1))),
    }
    ops = {}
    for name, out in results.items():
        buf = io.BytesIO()
        out.save(buf, "JPEG", quality=85)
        ops[name] = {"size": list(out.size), "mode": out.mode, "jpeg_bytes": buf.tell()}
    gray = results["gray"]
    unflipped = results["flip_lr"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return {
        "input": [w, h],
        "ops": ops,
        "gray_sha256": hashlib.sha256(gray.tobytes()).hexdigest(),
        "gray_mean": round(sum(gray.getdata()) / (w * h), 3),
        "flip_is_involution": unflipped.tobytes() == img.tobytes(),
        "latency_s": time.perf_counter() - t0,
    }
