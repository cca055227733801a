import pickle

import numpy as np
import pytest

from nasctl.errors import UsageError
from nasctl.evaluation.datasets import CIFAR_FILES, load_dataset


def _sizes(ds):
    return len(ds.y_train), len(ds.y_val), len(ds.y_test)


def test_digits_split_is_stratified_and_seeded():
    ds = load_dataset("digits", 0)
    assert ds.input_shape == (1, 8, 8) and ds.classes == 10
    assert sum(_sizes(ds)) == 1797
    assert 0.18 < len(ds.y_test) / 1797 < 0.22 and 0.14 < len(ds.y_val) / 1797 < 0.18
    for x, y in ((ds.x_train, ds.y_train), (ds.x_val, ds.y_val), (ds.x_test, ds.y_test)):
        assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape[1:] == (1, 8, 8)
        assert x.min() >= 0 and x.max() <= 1
        assert set(y) == set(range(10))
    same, other = load_dataset("digits", 0), load_dataset("digits", 1)
    assert np.array_equal(same.x_val, ds.x_val) and np.array_equal(same.y_test, ds.y_test)
    assert _sizes(other) == _sizes(ds)
    assert not np.array_equal(other.x_val, ds.x_val)


def _write_cifar(folder, n=20, skip=()):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in CIFAR_FILES:
        if name in skip:
            continue
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [i % 10 for i in range(n)]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    return folder


def test_cifar_batches_folder(tmp_path):
    ds = load_dataset(str(_write_cifar(tmp_path / "cifar-10-batches-py")), 3)
    assert ds.input_shape == (3, 32, 32) and ds.classes == 10
    assert _sizes(ds) == (80, 20, 20)
    mean = ds.x_train.mean(axis=(0, 2, 3))
    std = ds.x_train.std(axis=(0, 2, 3))
    assert np.allclose(mean, 0, atol=1e-4) and np.allclose(std, 1, atol=1e-3)


def test_cifar_folder_missing_a_batch(tmp_path):
    folder = _write_cifar(tmp_path / "cifar", skip=("data_batch_4",))
    with pytest.raises(UsageError, match="lacks data_batch_4"):
        load_dataset(str(folder), 0)


class _RunsCode:
    def __reduce__(self):
        return (exec, ("raise SystemExit('code ran')",))


def test_cifar_batch_that_asks_for_other_objects_is_refused(tmp_path):
    folder = _write_cifar(tmp_path / "cifar")
    with open(folder / "data_batch_2", "wb") as f:
        pickle.dump({b"data": _RunsCode(), b"labels": []}, f)
    with pytest.raises(UsageError, match="data_batch_2.*refusing to load builtins.exec"):
        load_dataset(str(folder), 0)


@pytest.mark.parametrize("shape, expected", [
    ((30, 8, 8, 3), (3, 8, 8)),     # N×H×W×C
    ((30, 3, 8, 8), (3, 8, 8)),     # N×C×H×W
    ((30, 8, 8), (1, 8, 8)),        # grayscale N×H×W
    ((30, 12, 12, 1), (1, 12, 12)),
])
def test_npz_layouts(tmp_path, shape, expected):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x_train=rng.integers(0, 256, shape, dtype=np.uint8), y_train=np.arange(30) % 3,
             x_test=rng.integers(0, 256, (10, *shape[1:]), dtype=np.uint8), y_test=np.arange(10) % 3)
    ds = load_dataset(str(path), 0)
    assert ds.input_shape == expected and ds.classes == 3
    assert _sizes(ds) == (24, 6, 10)
    assert ds.x_test.shape == (10, *expected) and ds.x_test.dtype == np.float32


def test_npz_errors(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_text("not a zip")
    with pytest.raises(UsageError, match=r"not a .npz archive \(made by numpy.savez\)") as e:
        load_dataset(str(path), 0)
    assert "pickle" not in str(e.value)  # what numpy says of a file that is no zip
    np.savez(path, x_train=np.zeros((4, 8, 8)), y_train=np.zeros(4, dtype=int), x_test=np.zeros((2, 8, 8)))
    with pytest.raises(UsageError, match="lacks y_test"):
        load_dataset(str(path), 0)
    np.savez(path, x_train=np.zeros((4, 8, 8)), y_train=np.zeros(3, dtype=int),
             x_test=np.zeros((2, 8, 8)), y_test=np.zeros(2, dtype=int))
    with pytest.raises(UsageError, match="x_train has 4 images but y_train 3 labels"):
        load_dataset(str(path), 0)
    np.savez(path, x_train=np.zeros((4, 8, 8)), y_train=np.array([0.5, 1, 0, 1]),
             x_test=np.zeros((2, 8, 8)), y_test=np.zeros(2, dtype=int))
    with pytest.raises(UsageError, match=r"bad.npz': y_train: label 0.5 \(item 0\) is not a class index"):
        load_dataset(str(path), 0)


def test_unknown_name_missing_path_and_wrong_files(tmp_path):
    with pytest.raises(UsageError, match=r"dataset 'foo' is not a built-in \(digits\) nor an existing path"):
        load_dataset("foo", 0)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UsageError, match="not an .npz"):
        load_dataset(str(tmp_path / "notes.txt"), 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="neither a CIFAR-10"):
        load_dataset(str(tmp_path / "empty"), 0)


def test_image_folder(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for split, n in (("train", 10), ("test", 3)):
        for cls in ("cat", "dog"):
            (tmp_path / "pets" / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "pets" / split / cls / f"{i}.png")
    ds = load_dataset(str(tmp_path / "pets"), 0)
    assert ds.input_shape == (3, 6, 6) and ds.classes == 2
    assert _sizes(ds) == (16, 4, 6)
    # without train/ and test/, a test split is held out too
    ds = load_dataset(str(tmp_path / "pets" / "train"), 0)
    assert _sizes(ds) == (12, 4, 4)


def _npz(path, x_train=None, y_train=None, x_test=None, y_test=None):
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((30, 8, 8)), "y_train": np.arange(30) % 3,
              "x_test": rng.random((9, 8, 8)), "y_test": np.arange(9) % 3}
    given = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    np.savez(path, **{**arrays, **{k: v for k, v in given.items() if v is not None}})
    return str(path)


def _refused(spec, *texts):
    with pytest.raises(UsageError) as info:
        load_dataset(spec, 0)
    message = str(info.value)
    assert "\n" not in message and all(t in message for t in texts), message


def test_npz_with_object_arrays_is_refused_in_one_line(tmp_path):
    labels = np.empty(30, dtype=object)
    labels[:] = [i % 3 for i in range(30)]
    path = _npz(tmp_path / "objects.npz", y_train=labels)
    _refused(path, f"dataset file '{path}': array y_train holds Python objects (dtype object)",
             "allowed: numeric arrays")
    _refused(_npz(tmp_path / "text.npz", x_test=np.full((9, 8, 8), "a")), "array x_test has dtype <U1")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_npz_with_nan_or_infinite_pixels_is_refused(tmp_path, bad):
    x = np.random.default_rng(0).random((30, 8, 8))
    x[7, 2, 3] = bad
    path = _npz(tmp_path / "d.npz", x_train=x)
    _refused(path, f"dataset file '{path}': x_train holds 1 NaN or infinite pixel value(s) (first in image 7)",
             "allowed: finite numbers")


def test_pixels_beyond_float32_are_refused(tmp_path):
    x = np.random.default_rng(0).random((9, 8, 8))
    x[0, 0, 0] = 1e300
    _refused(_npz(tmp_path / "d.npz", x_test=x), "test images (as float32) holds 1 NaN or infinite")


@pytest.mark.parametrize("y_train, y_test, texts", [
    (np.r_[np.arange(29) % 3, -1], None, ["y_train: label -1 (item 29) is out of range; allowed: 0 … K-1"]),
    (np.r_[np.arange(29) % 3, 99], None, ["labels run up to 99 but no training image has label 3, 4, 5, 6, 7, …",
                                          "renumber the 4 classes 0 … 3"]),
    ((np.arange(30) % 3) + 1, None, ["no training image has label 0"]),
    (None, np.r_[np.arange(8) % 3, 5], ["test label 5 has no training image; allowed: the training classes 0 … 2"]),
    (np.arange(30) % 3 + 0.5, None, ["y_train: label 0.5 (item 0) is not a class index"]),
    (np.zeros(30), np.zeros(9), ["every training image has label 0: one class", "allowed: at least 2 classes"]),
])
def test_npz_labels_must_be_the_classes_0_to_k_minus_1(tmp_path, y_train, y_test, texts):
    _refused(_npz(tmp_path / "d.npz", y_train=y_train, y_test=y_test), *texts)


def test_whole_float_labels_are_class_indices(tmp_path):
    ds = load_dataset(_npz(tmp_path / "d.npz", y_train=(np.arange(30) % 3).astype(float)), 0)
    assert ds.classes == 3 and ds.y_train.dtype == np.int64


def test_cifar_batch_with_a_label_beyond_ten_classes_is_refused(tmp_path):
    folder = _write_cifar(tmp_path / "cifar")
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((20, 3072), dtype=np.uint8), b"labels": [99] + [i % 10 for i in range(19)]},
                    f)
    _refused(str(folder), f"CIFAR-10 batch '{folder / 'data_batch_3'}': label 99 (item 0) is out of range; "
                          "allowed: 0 … 9 (10 classes)")
