"""video_processing (FunctionBench): OpenCV reads every frame of a video, converts it to
grayscale and writes a new video. The input (args["frames"] frames of args["width"] ×
args["height"], defaults 60 of 320 × 240, at most 600 of 1280 × 720) is generated on first use
into /tmp as Motion-JPEG AVI (nothing is downloaded) and reused; the output is written to /tmp,
read back to count its frames, and removed. Returns the counts, the output's size and the mean
gray level."""

import os
import tempfile
import time

import cv2
import numpy as np


def _int(args: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = args.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{key} must be an integer in [{lo}, {hi}]")
    return v


FOURCC = cv2.VideoWriter_fourcc(*"MJPG")


def make_input(path: str, frames: int, w: int, h: int) -> None:
    """A moving coloured square over a gradient: deterministic, compresses like real video."""
    out = cv2.VideoWriter(path, FOURCC, 30.0, (w, h))
    if not out.isOpened():
        raise RuntimeError("OpenCV cannot write Motion-JPEG")
    base = np.zeros((h, w, 3), np.uint8)
    base[:, :, 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
    base[:, :, 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    side = max(min(w, h) // 4, 1)
    for i in range(frames):
        f = base.copy()
        x, y = (i * 7) % max(w - side, 1), (i * 5) % max(h - side, 1)
        f[y : y + side, x : x + side] = (0, 0, 255)
        out.write(f)
    out.release()


def input_path(frames: int, w: int, h: int) -> str:
    path = os.path.join(tempfile.gettempdir(), f"hearth-fb-video-{frames}-{w}x{h}.avi")
    if not os.path.exists(path):
        tmp = path[:-4] + ".%d.avi" % os.getpid()
        make_input(tmp, frames, w, h)
        os.replace(tmp, path)
    return path


def count_frames(path: str) -> int:
    cap = cv2.VideoCapture(path)
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


def main(args: dict) -> dict:
    frames = _int(args, "frames", 60, 1, 600)
    w = _int(args, "width", 320, 16, 1280)
    h = _int(args, "height", 240, 16, 720)
    src = input_path(frames, w, h)
    fd, dst = tempfile.mkstemp(prefix="hearth-fb-gray-", suffix=".avi")
    os.close(fd)
    t0 = time.perf_counter()
    try:
        cap = cv2.VideoCapture(src)
        out = cv2.VideoWriter(dst, FOURCC, 30.0, (w, h), isColor=False)
        n, total = 0, 0.0
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            gray = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
            total += float(gray.mean())
            out.write(gray)
            n += 1
        cap.release()
        out.release()
        written = count_frames(dst)
        size = os.path.getsize(dst)
    finally:
        os.unlink(dst)
    return {
        "frames_read": n,
        "frames_written": written,
        "size": [w, h],
        "output_bytes": size,
        "mean_gray": round(total / max(n, 1), 3),
        "latency_s": time.perf_counter() - t0,
    }
