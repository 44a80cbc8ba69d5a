"""The size limits every reader checks before it allocates (one place, stated in bytes or counts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    json_bytes: int = 64 << 20  # a JSON file exhume reads (victim.json, metrics.json, ...)
    json_depth: int = 32  # nesting of objects and lists
    idx_bytes: int = 256 << 20  # decompressed IDX data (MNIST's training images: 47 MB)
    tar_member_bytes: int = 256 << 20  # one CIFAR batch is 31 MB
    npy_header_bytes: int = 10_000
    npy_items: int = 50_000_000  # train_indices.npy: one int64 per training image
    image_pixels: int = 4096 * 4096  # one image of an image folder
    folder_pixels: int = 1 << 28  # all images of an image folder (1 GiB as float32)
    torch_file_bytes: int = 2 << 30  # a checkpoint (torch.save; the demo's is under 10 MB); a resumed run may read its own larger one (expected_limit)
    model_parameters: int = 100_000_000  # an architecture in victim.json or --arch (400 MB as float32)
    candidates_x_pool_block: int = 4_000_000  # similarity entries held at once by exhume evaluate (32 MB)
    one_to_one_entries: int = 25_000_000  # training images x candidates for the Hungarian matching (200 MB)
    npz_bytes: int = 1 << 30  # an .npz of records an attacker knows (known records, candidates)
    gradient_matrix_bytes: int = 1 << 30  # per-sample gradients held at once by the audit's KKT residual check


LIMITS = Limits()
