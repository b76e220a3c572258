"""A run's checkpoint files beyond train.py's lesson (atomic write, keep the last K, safe load): the
sha256 inside each file (`save_with_checksum` for train.atomic_save's `save`, `verify_checksum` for
train.load_checkpoint's `verify`) and every random generator's state for an exact resume.

Serves: machinery/run.py and machinery/hf.py (they write and read the run's checkpoints), tests.
"""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np
import torch

import train


def save_with_checksum(obj, file) -> None:
    """torch.save `obj` into the open binary `file`, with its sha256 as the zip's comment."""
    hashing = HashingWriter(file)
    torch.save(obj, hashing)
    append_checksum(hashing)


def save(obj, path):
    """train.atomic_save with the checksum inside: how the run writes every checkpoint."""
    return train.atomic_save(obj, path, save=save_with_checksum)


def load(path_or_dir, log=print) -> dict:
    """train.load_checkpoint with the checksum checked first: how the run reads every checkpoint."""
    return train.load_checkpoint(path_or_dir, log, verify=verify_checksum)


def rng_state() -> dict:
    """Every random generator the run touches, as plain tensors/lists (weights_only-loadable). On
    CUDA, only the generator of this rank's GPU (the current device, which the launcher sets): each
    rank saves its own, and a resume where a process sees fewer GPUs (one per process, as
    under many schedulers) still finds it."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of rng_state(): the CUDA generator goes back to this rank's GPU (a checkpoint of an
    older train.py holds a list, one per visible GPU: not restored)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and torch.is_tensor(state.get("cuda")):
        torch.cuda.set_rng_state(state["cuda"])


CHECKSUM_TAG = b"sha256:"
CHECKSUM_LEN = len(CHECKSUM_TAG) + 64  # the zip comment: tag + hex digest


class HashingWriter:
    """A write-only file that feeds every byte torch.save streams into it to a sha256 as well, and
    keeps the last 22 bytes (the zip's end record, which append_checksum completes)."""

    def __init__(self, file):
        self.file, self.digest, self.tail = file, hashlib.sha256(), b""

    def write(self, data) -> int:
        self.digest.update(data)
        self.tail = (self.tail + bytes(memoryview(data).cast("B")[-22:]))[-22:]
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def append_checksum(hashing: HashingWriter) -> None:
    """Store the sha256 of a torch.save zip inside it, as the zip's comment (the file's last bytes).

    torch.load checks no CRC, so 4 KiB of zeros inside the weights load silently as wrong numbers;
    the digest catches that. A zip ends with a 22-byte record whose last 2 bytes give the comment's
    length (0 after torch.save); we set it to 71 and append b"sha256:" + the 64 hex digits of the
    zip as torch.save wrote it. The file stays a valid zip, so torch.load (and any zip tool) still
    reads it as it is.
    """
    if hashing.tail[:4] != b"PK\x05\x06" or hashing.tail[-2:] != b"\x00\x00":
        raise ValueError("not a zip written by torch.save (no end record without a comment)")
    hashing.file.seek(-2, os.SEEK_END)
    hashing.file.write(
        CHECKSUM_LEN.to_bytes(2, "little") + CHECKSUM_TAG + hashing.digest.hexdigest().encode()
    )


def verify_checksum(path) -> None:
    """Raise ValueError when the sha256 stored by append_checksum does not match the file's bytes. A
    file without one (written by hand or an older train.py) passes: torch.load's own checks are all
    it gets."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < CHECKSUM_LEN + 22:
            return
        f.seek(size - CHECKSUM_LEN)
        stored = f.read()
        if not stored.startswith(CHECKSUM_TAG):
            return
        # the zip up to its comment length
        digest, remaining = hashlib.sha256(), size - CHECKSUM_LEN - 2
        f.seek(0)
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 24))
            digest.update(chunk)
            remaining -= len(chunk)
        # ... which torch.save wrote as 0
        digest.update(b"\x00\x00")
    if digest.hexdigest().encode() != stored[len(CHECKSUM_TAG) :]:
        raise ValueError("sha256 mismatch: the file's bytes changed after it was written")
