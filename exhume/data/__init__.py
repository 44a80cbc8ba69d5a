"""Datasets and victim training tasks."""

from exhume.data.datasets import (
    CIFAR10_CLASSES,
    DATASET_NAMES,
    DEBIAN_FASHION_MNIST,
    FASHION_CLASSES,
    MNIST_CLASSES,
    ImageDataset,
    load_bundled_mnist,
    load_cifar10,
    load_dataset,
    load_fashion_mnist,
    load_idx,
    load_image_folder,
    load_mnist_idx,
    load_sklearn_digits,
)
from exhume.data.tasks import (
    DEFAULT_LOSS,
    PRESETS,
    TASK_KINDS,
    TaskData,
    as_regression,
    check_task_loss,
    dataset_of,
    make_pool,
    make_task,
    out_features,
    parse_task,
    rebuild_task,
    select_pool,
    select_task,
    task_kind,
)

__all__ = [
    "CIFAR10_CLASSES", "DATASET_NAMES", "DEBIAN_FASHION_MNIST", "FASHION_CLASSES", "MNIST_CLASSES",
    "ImageDataset", "load_bundled_mnist", "load_cifar10", "load_dataset", "load_fashion_mnist",
    "load_idx", "load_image_folder", "load_mnist_idx", "load_sklearn_digits",
    "PRESETS", "TaskData", "dataset_of", "make_pool", "make_task", "parse_task", "rebuild_task",
    "DEFAULT_LOSS", "TASK_KINDS", "as_regression", "check_task_loss", "out_features", "select_pool", "select_task", "task_kind",
]
