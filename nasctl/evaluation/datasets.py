"""Datasets for proxy training: a built-in one and the common on-disk formats.

`load_dataset(spec, seed)` accepts
  - `digits`: scikit-learn's bundled 8×8 handwritten digits (1 channel, 10 classes),
    pixels scaled to [0, 1];
  - a CIFAR-10 python-batches folder (`data_batch_1` … `data_batch_5`, `test_batch`,
    as unpacked from cifar-10-python.tar.gz);
  - an `.npz` file with `x_train`, `y_train`, `x_test`, `y_test`; images N×H×W
    (grayscale), N×C×H×W or N×H×W×C (channels: whichever of axis 1 and axis 3 is
    shorter, axis 1 on a tie); labels 0 … K-1;
  - an image folder, `root/train/<class>/*` and `root/test/<class>/*`, or `root/<class>/*`
    (needs Pillow); classes are the sorted folder names.
CIFAR, npz and image-folder pixels are normalised per channel with the training split's
mean and standard deviation.

Splits are stratified and drawn from `seed`: where the source has no test split, 20 % of
each class is held out as test; then 20 % of each class of what remains is validation.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UsageError

BUILTIN = ("digits",)
HOLDOUT = 0.2  # share of each class held out for test (when the source has none) and for validation
CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
CIFAR_CLASSES = 10
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass
class Dataset:
    """Images as float32 N×C×H×W, labels as int64 in 0 … classes-1."""

    name: str
    input_shape: tuple[int, int, int]
    classes: int
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    # How raw pixels became these arrays: {"divide": d} (x / d) or {"mean": [...], "std": [...]}
    # per channel ((x - mean) / std), what a deployed model's inputs need too.
    normalisation: dict = field(default_factory=dict)


def load_dataset(spec: str, seed: int) -> Dataset:
    """The dataset named or pointed to by `spec`, split by `seed` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    if spec == "digits":
        return _digits(rng)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".npz":
            raise UsageError(f"dataset file '{spec}' is not an .npz; allowed files: .npz with "
                             f"{', '.join(NPZ_KEYS)}")
        return _npz(path, rng)
    if path.is_dir():
        if any((path / f).exists() for f in CIFAR_FILES):
            return _cifar(path, rng)
        if any(p.is_dir() for p in path.iterdir()):
            return _image_folder(path, rng)
        raise UsageError(f"dataset folder '{spec}' is neither a CIFAR-10 python-batches folder "
                         f"({', '.join(CIFAR_FILES)}) nor an image folder (train/<class>/*, "
                         "test/<class>/* or <class>/*)")
    raise UsageError(f"dataset '{spec}' is not a built-in ({', '.join(BUILTIN)}) nor an existing path")


# -- sources ----------------------------------------------------------------------------
def _digits(rng: np.random.Generator) -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    data = _assemble("digits", x, d.target, None, None, rng, normalise=False)
    data.normalisation = {"divide": 16.0}
    return data


def _cifar(path: Path, rng: np.random.Generator) -> Dataset:
    missing = [f for f in CIFAR_FILES if not (path / f).is_file()]
    if missing:
        raise UsageError(f"CIFAR-10 folder '{path}' lacks {', '.join(missing)}; "
                         f"it needs {', '.join(CIFAR_FILES)}")

    def batch(name: str) -> tuple[np.ndarray, np.ndarray]:
        try:
            with open(path / name, "rb") as f:
                d = _BatchUnpickler(f, encoding="bytes").load()
            x, y = np.asarray(d[b"data"], dtype=np.uint8), np.asarray(d[b"labels"])
        except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"CIFAR-10 batch '{path / name}' is not a python batch with data and "
                             f"labels entries ({e.__class__.__name__}: {e})") from None
        if len(x) != len(y) or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise UsageError(f"CIFAR-10 batch '{path / name}' holds {x.shape} data for {len(y)} labels; "
                             "allowed: N×3072 data and N labels")
        return x.reshape(-1, 3, 32, 32), _labels(y, f"CIFAR-10 batch '{path / name}'", CIFAR_CLASSES)

    train = [batch(f) for f in CIFAR_FILES[:-1]]
    x_test, y_test = batch("test_batch")
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    return _assemble(path.name, x_train, y_train, x_test, y_test, rng, normalise=True,
                     source=f"CIFAR-10 folder '{path}'")


class _BatchUnpickler(pickle.Unpickler):
    """Reads the CIFAR python batches, pickles written by the dataset's authors (its only
    format), allowing just the plain data they hold (dicts, lists, bytes, numpy arrays):
    any other object a file asks for is refused, so a tampered file cannot run code."""

    ALLOWED = {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")}
    ALLOWED |= {(m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")}
    ALLOWED |= {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _npz(path: Path, rng: np.random.Generator) -> Dataset:
    if path.is_file() and not zipfile.is_zipfile(path):  # np.load would try it as a pickle, and say so
        raise UsageError(f"dataset file '{path}' is not a .npz archive (made by numpy.savez); it holds "
                         "x_train, y_train, x_test, y_test")
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UsageError(f"dataset file '{path}' is not a readable .npz ({e})") from None
    with f:
        missing = [k for k in NPZ_KEYS if k not in f.files]
        if missing:
            raise UsageError(f"dataset file '{path}' lacks {', '.join(missing)}; "
                             f"it needs {', '.join(NPZ_KEYS)} (has {', '.join(f.files) or 'nothing'})")
        arrays = {k: _npz_array(f, k, path) for k in NPZ_KEYS}
    xs, ys = [], []
    for part in ("train", "test"):
        x, y = arrays[f"x_{part}"], arrays[f"y_{part}"]
        if x.ndim == 0 or y.ndim == 0:
            raise UsageError(f"dataset file '{path}': x_{part} and y_{part} must be arrays of images and of "
                             f"labels, not single values")
        if len(x) != len(y):
            raise UsageError(f"dataset file '{path}': x_{part} has {len(x)} images but y_{part} "
                             f"{len(y)} labels; they must match")
        _check_pixels(x, f"dataset file '{path}': x_{part}")
        xs.append(_to_nchw(x, f"{path}: x_{part}"))
        ys.append(_labels(y, f"dataset file '{path}': y_{part}"))
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise UsageError(f"dataset file '{path}': train images are {xs[0].shape[1:]} (C, H, W) but "
                         f"test images {xs[1].shape[1:]}; they must match")
    return _assemble(path.stem, xs[0], ys[0], xs[1], ys[1], rng, normalise=True,
                     source=f"dataset file '{path}'")


def _npz_array(f, key: str, path: Path) -> np.ndarray:
    """Array `key` of an open .npz; arrays of Python objects are refused (loading them means
    unpickling, which can run code), as is any array numpy cannot read."""
    try:
        a = f[key]
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise UsageError(f"dataset file '{path}': array {key} holds Python objects (dtype object), which "
                             "nasctl does not load (unpickling can run code); allowed: numeric arrays") from None
        raise UsageError(f"dataset file '{path}': array {key} cannot be read ({e})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise UsageError(f"dataset file '{path}': array {key} cannot be read ({e})") from None
    allowed = "uint8 … float64 pixels" if key.startswith("x") else "integer labels"
    if a.dtype.kind not in "biuf":
        raise UsageError(f"dataset file '{path}': array {key} has dtype {a.dtype}; allowed: {allowed}")
    return a


def _check_pixels(x: np.ndarray, what: str) -> None:
    """Refuse NaN and infinite pixels (they train to chance silently), naming the first."""
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x)
        if bad.any():
            first = int(np.flatnonzero(bad.reshape(len(x), -1).any(axis=1))[0])
            raise UsageError(f"{what} holds {int(bad.sum())} NaN or infinite pixel value(s) (first in image "
                             f"{first}); allowed: finite numbers")


def _labels(y, what: str, classes: int | None = None) -> np.ndarray:
    """Labels as int64, checked: whole numbers 0 … K-1 (K = `classes` where the format fixes it)."""
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind not in "biuf":
        raise UsageError(f"{what}: labels have dtype {y.dtype}; allowed: class indices 0 … K-1 (integers)")
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if len(bad):
            raise UsageError(f"{what}: label {float(y[bad[0]]):g} (item {bad[0]}) is not a class index; "
                             "allowed: integers 0 … K-1")
    top = "K-1" if classes is None else str(classes - 1)
    bad = np.flatnonzero((y < 0) | (y >= (classes if classes is not None else np.inf)))
    if len(bad):
        raise UsageError(f"{what}: label {y[bad[0]]:g} (item {bad[0]}) is out of range; allowed: 0 … {top}"
                         + (f" ({classes} classes)" if classes is not None else ""))
    return y.astype(np.int64)


def _to_nchw(x: np.ndarray, what: str) -> np.ndarray:
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4:
        return x if x.shape[1] <= x.shape[3] else x.transpose(0, 3, 1, 2)
    raise UsageError(f"{what} has shape {x.shape}; allowed: N×H×W, N×C×H×W or N×H×W×C")


def _image_folder(path: Path, rng: np.random.Generator) -> Dataset:
    try:
        from PIL import Image
    except ImportError:
        raise UsageError(f"reading the image folder '{path}' needs Pillow: pip install 'nasctl[images]'") from None

    def read(root: Path, classes: list[str] | None) -> tuple[list[str], np.ndarray, np.ndarray]:
        found = sorted(p.name for p in root.iterdir() if p.is_dir())
        if classes is not None and found != classes:
            raise UsageError(f"image folder '{root}' has classes {found}; they must be the "
                             f"training classes {classes}")
        images, labels = [], []
        for label, name in enumerate(found):
            for f in sorted((root / name).iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    with Image.open(f) as im:
                        images.append(np.asarray(im.convert("L" if im.mode in ("1", "L") else "RGB")))
                    labels.append(label)
        if not images:
            raise UsageError(f"image folder '{root}' holds no images ({', '.join(IMAGE_SUFFIXES)}) "
                             "in its class folders")
        if len({im.shape for im in images}) > 1:
            raise UsageError(f"images under '{root}' differ in size or channels; they must all match")
        return found, _to_nchw(np.stack(images), str(root)), np.array(labels)

    if (path / "train").is_dir() and (path / "test").is_dir():
        classes, x_train, y_train = read(path / "train", None)
        _, x_test, y_test = read(path / "test", classes)
        if x_train.shape[1:] != x_test.shape[1:]:
            raise UsageError(f"image folder '{path}': train and test images differ in size; they must match")
        return _assemble(path.name, x_train, y_train, x_test, y_test, rng, normalise=True)
    _, x, y = read(path, None)
    return _assemble(path.name, x, y, None, None, rng, normalise=True)


# -- splitting and normalising ----------------------------------------------------------
def _holdout(y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Indices (kept, held out), holding out round(HOLDOUT · n_c) of each class c, at random."""
    kept, held = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n = int(round(HOLDOUT * len(idx)))
        held.append(idx[:n])
        kept.append(idx[n:])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def _assemble(name, x, y, x_test, y_test, rng, *, normalise: bool, source: str | None = None) -> Dataset:
    source = source or f"dataset '{name}'"
    y = _labels(y, source)
    if len(y) == 0:
        raise UsageError(f"{source} has no training images")
    if x_test is None:
        kept, held = _holdout(y, rng)
        x, y, x_test, y_test = x[kept], y[kept], x[held], y[held]
    y_test = _labels(y_test, source)
    classes = int(y.max()) + 1
    unused = sorted(set(range(classes)) - set(y.tolist()))
    if unused:
        shown = ", ".join(map(str, unused[:5])) + (", …" if len(unused) > 5 else "")
        used = len(set(y.tolist()))
        raise UsageError(f"{source}: labels run up to {classes - 1} but no training image has label {shown}; "
                         f"allowed: labels 0 … K-1 with every class present (renumber the {used} classes "
                         f"0 … {used - 1})")
    if classes < 2:
        raise UsageError(f"{source}: every training image has label 0: one class, nothing to tell apart; "
                         "allowed: at least 2 classes")
    if y_test.max(initial=0) >= classes:
        raise UsageError(f"{source}: test label {int(y_test.max())} has no training image; allowed: the "
                         f"training classes 0 … {classes - 1}")
    train, val = _holdout(y, rng)
    if min(len(train), len(val), len(y_test)) == 0:
        raise UsageError(f"dataset '{name}' is too small to split: {len(train)} training, {len(val)} "
                         f"validation and {len(y_test)} test images; each split needs at least one")
    with np.errstate(over="ignore", invalid="ignore"):  # values beyond float32 are refused just below
        x_train, x_val, x_test = (np.array(a, dtype=np.float32) for a in (x[train], x[val], x_test))
    for part, a in (("training", x_train), ("validation", x_val), ("test", x_test)):
        _check_pixels(a, f"{source}: {part} images (as float32)")  # e.g. float64 values beyond float32
    normalisation = {}
    if normalise:
        mean = x_train.mean(axis=(0, 2, 3), keepdims=True)
        std = x_train.std(axis=(0, 2, 3), keepdims=True) + 1e-6
        for a in (x_train, x_val, x_test):
            a -= mean
            a /= std
        normalisation = {"mean": mean.ravel().tolist(), "std": std.ravel().tolist()}
    return Dataset(normalisation=normalisation, name=name, input_shape=tuple(int(s) for s in x_train.shape[1:]),
                   classes=classes,
                   x_train=x_train, y_train=y[train].astype(np.int64),
                   x_val=x_val, y_val=y[val].astype(np.int64),
                   x_test=x_test, y_test=y_test.astype(np.int64))

