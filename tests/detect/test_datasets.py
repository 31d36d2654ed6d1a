"""Loaders for ASD, NAB and the user CSV format; imputation and refusals; windows and window sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vigil.detect.learned.windows import WindowSet, windows
from vigil.model import VigilInputError
from vigil_eval.datasets import impute, load_asd, load_csv, load_nab, read_array
from vigil_eval.formats import load


def test_asd_loads_eight_entities(shared_data: Path) -> None:
    ds = load_asd(shared_data / "asd", ["omi-1", "omi-2"])
    assert list(ds.entities) == ["omi-1", "omi-2"] and len(ds.features) == 19
    omi1 = ds.entities["omi-1"]
    assert omi1.train is not None and omi1.train.shape == (8640, 19) and omi1.test.shape == (4320, 19)
    assert set(np.unique(omi1.test_labels)) == {0, 1} and 0.05 < omi1.test_labels.mean() < 0.15


def test_nab_labels_come_from_the_windows(shared_data: Path) -> None:
    ds = load_nab(shared_data / "nab", ["nyc_taxi", "machine_temperature_system_failure"])
    taxi = ds.entities["nyc_taxi"]
    assert taxi.train is not None and taxi.n_features == 1
    total = len(taxi.train) + len(taxi.test)
    assert total == 10320 and abs(len(taxi.train) - 0.15 * total) <= 1
    assert taxi.test_labels.sum() > 0 and taxi.train_labels is not None


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_csv_format_with_classes_split_and_imputation(tmp_path: Path) -> None:
    write(tmp_path / "gpu-a.csv", "timestamp,temp,power,label,split\n"
          "1,50,300,0,train\n2,,310,0,train\n3,52,305,normal,test\n4,80,100,gpu_thermal,test\n")
    write(tmp_path / "gpu-b.csv", "timestamp,temp,power,label,split\n"
          "1,49,299,0,train\n2,50,300,0,test\n3,51,301,nvlink_error,test\n")
    ds = load_csv(tmp_path)
    assert ds.features == ["temp", "power"] and ds.classes == ["normal", "gpu_thermal", "nvlink_error"]
    a = ds.entities["gpu-a"]
    assert a.train is not None and a.train[1, 0] == 50 and a.imputed == 1
    assert a.test_labels.tolist() == [0, 1] and ds.entities["gpu-b"].test_labels.tolist() == [0, 2]


def test_csv_without_split_uses_the_first_half_for_training(tmp_path: Path) -> None:
    write(tmp_path / "e.csv", "m1,label\n" + "".join(f"{i},{int(i == 7)}\n" for i in range(8)))
    e = load("csv", tmp_path).entities["e"]
    assert e.train is not None and len(e.train) == 4 and e.test_labels.tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize(("text", "message"), [
    ("m1,m2\n1,2\n", "no 'label' column"),
    ("m1,label\n1,0\nx,1\n", "not a number"),
    ("m1,label\n1,0\n2,\n", "empty label"),
    ("m1,label\n,0\n,1\n", "no finite value"),
    ("timestamp,m1,label\n2024-01-01,1,0\nyesterday,2,1\n", "bad timestamp"),
])
def test_bad_csv_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path / "e.csv", text)
    with pytest.raises(VigilInputError, match=message) as info:
        load_csv(tmp_path)
    assert "\n" not in str(info.value)


def test_csv_files_must_share_their_metrics(tmp_path: Path) -> None:
    write(tmp_path / "a.csv", "m1,m2,label\n1,2,0\n3,4,1\n")
    write(tmp_path / "b.csv", "m1,label\n1,0\n3,1\n")
    with pytest.raises(VigilInputError, match="differ"):
        load_csv(tmp_path)


def test_unknown_format_and_missing_data(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="unknown data format"):
        load("parquet", tmp_path)
    with pytest.raises(VigilInputError, match="does not exist"):
        load_asd(tmp_path / "nope")


def test_impute_forward_then_backward() -> None:
    filled, count = impute(np.array([[np.nan, 1.0], [2.0, np.inf], [np.nan, 3.0]]), where="t")
    assert count == 3 and filled.tolist() == [[2.0, 1.0], [2.0, 1.0], [2.0, 3.0]]


def test_windows_use_history_then_repeat_the_first_row() -> None:
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    w = windows(values, 3)
    assert w.shape == (5, 3, 2) and w[0, :, 0].tolist() == [0, 0, 0] and w[4, :, 0].tolist() == [4, 6, 8]
    hist = -np.ones((4, 2), dtype=np.float32)
    assert windows(values, 3, history=hist)[0, :, 0].tolist() == [-1, -1, 0]


def test_window_set_gathers_across_series() -> None:
    a = np.arange(20, dtype=np.float32).reshape(10, 2)
    b = 100 + np.arange(12, dtype=np.float32).reshape(6, 2)
    ws = WindowSet(4).add(a, np.r_[np.zeros(9), 1], rows=np.arange(0, 10, 3)).add(b, np.ones(6))
    assert len(ws) == 4 + 6 and ws.labels.tolist() == [0, 0, 0, 1] + [1] * 6
    batch = ws.take(np.array([3, 4]))
    assert batch[0, -1].tolist() == [18, 19] and batch[1, -1].tolist() == [100, 101]
    assert ws.take(np.array([9]), last=2).shape == (1, 2, 2)
    with pytest.raises(VigilInputError, match="metrics"):
        ws.add(np.zeros((3, 5), dtype=np.float32))


def test_numeric_pickles_are_read_as_data(tmp_path: Path) -> None:
    import gzip
    import pickle

    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    for protocol in (3, 4):
        (tmp_path / "a.pkl").write_bytes(pickle.dumps(table, protocol=protocol))
        assert np.array_equal(read_array(tmp_path / "a.pkl"), table)
    labels = np.array([0, 1, 1, 0], dtype=np.int64)
    (tmp_path / "b.pkl.gz").write_bytes(gzip.compress(pickle.dumps(labels)))
    got = read_array(tmp_path / "b.pkl.gz")
    assert got.dtype == np.int64 and np.array_equal(got, labels)
    fortran = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    (tmp_path / "c.pkl").write_bytes(pickle.dumps(fortran))
    assert np.array_equal(read_array(tmp_path / "c.pkl"), fortran)


class _Hostile:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("touch pwned",))


def test_a_hostile_pickle_is_refused_and_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.pkl").write_bytes(pickle.dumps(_Hostile()))
    with pytest.raises(VigilInputError, match="refusing to load class (posix|os).system"):
        read_array(tmp_path / "x.pkl")
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "o.pkl").write_bytes(pickle.dumps(np.array(["a", None], dtype=object)))
    with pytest.raises(VigilInputError):
        read_array(tmp_path / "o.pkl")
    (tmp_path / "d.pkl").write_bytes(pickle.dumps({"not": "an array"}))
    with pytest.raises(VigilInputError, match="expected a numeric array"):
        read_array(tmp_path / "d.pkl")
    (tmp_path / "t.pkl").write_bytes(pickle.dumps(np.zeros(8, dtype=np.float32))[:-20])
    with pytest.raises(VigilInputError):
        read_array(tmp_path / "t.pkl")


@pytest.mark.slow
def test_smd_machines_without_published_metrics_are_not_entities(shared_data: Path) -> None:
    ds = load_asd(shared_data / "smd")
    assert "machine-1-1" not in ds.entities and len(ds.entities) == 14 and len(ds.features) == 38
    series = ds.entities["machine-1-2"]
    assert series.train is not None and series.train.shape[1] == 38 and len(series.test) == len(series.test_labels)
