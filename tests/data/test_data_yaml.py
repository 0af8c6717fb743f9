"""Dataset yaml resolution (yolov9c/data/dataset_yaml.py) and split file lists (image_list.py).

Run: python -m pytest -q tests/data/test_data_yaml.py
"""

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolov9c.data.dataset_yaml import DataConfigError, load_data_config
from yolov9c.data.image_list import collect_image_files
from yolov9c.data.labels import label_path_for
from repo_assets import COCO24  # noqa: E402


def _img(path, h=32, w=48):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((h, w, 3), 90, np.uint8))
    return path


def _tree(root):
    for split in ("train", "val"):
        for i in range(3):
            _img(root / "images" / split / f"{i}.jpg")
    (root / "images" / "train" / "notes.md").write_text("not an image")
    (root / "images" / "train" / "sub").mkdir()
    _img(root / "images" / "train" / "sub" / "deep.png")
    return root


def _write(path, cfg):
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_folders_relative_to_yaml_and_names_dict(tmp_path):
    root = _tree(tmp_path / "ds")
    y = _write(root / "d.yaml", {"path": ".", "train": "images/train", "val": "images/val",
                                 "names": {0: "cat", 1: "dog"}})
    cfg = load_data_config(y)
    assert cfg["path"] == str(root.resolve())
    assert cfg["train"] == [str(root.resolve() / "images/train")]
    assert cfg["nc"] == 2 and cfg["names"] == ["cat", "dog"] and cfg["test"] == []
    files = collect_image_files(cfg["train"])
    # recursive, image extensions only (notes.md ignored)
    assert [Path(f).name for f in files] == ["0.jpg", "1.jpg", "2.jpg", "deep.png"]


def test_path_absent_means_yaml_folder_and_list_of_sources(tmp_path):
    root = _tree(tmp_path / "ds")
    lst = root / "extra.txt"
    lst.write_text("./images/val/0.jpg\nimages/val/1.jpg\n\n")
    y = _write(root / "d.yaml", {"train": ["images/train", "extra.txt"], "val": "extra.txt", "nc": 3,
                                 "names": ["a", "b", "c"]})
    cfg = load_data_config(y)
    assert len(cfg["train"]) == 2
    files = collect_image_files(cfg["train"])
    assert len(files) == 6  # 4 from the folder + 2 from the list
    val = collect_image_files(cfg["val"])
    assert val == sorted([str(root / "images/val/0.jpg"), str(root / "images/val/1.jpg")])


def test_list_keeps_non_image_lines_for_the_scan_to_report(tmp_path):
    root = _tree(tmp_path / "ds")
    (root / "list.txt").write_text("./images/train/0.jpg\n./images/train/notes.md\n")
    files = collect_image_files(root / "list.txt")
    assert any(f.endswith("notes.md") for f in files)


def test_list_with_bom_or_utf16_is_read_and_latin1_is_one_error(tmp_path):
    # Windows editors write a BOM (or UTF-16): the first image is not lost to a '\ufeff./...' path; a list
    # that is not UTF-8 is one error naming it (check-data: `error:` and exit 2), not a UnicodeDecodeError
    from yolov9c.data.image_list import ImageListError

    root = _tree(tmp_path / "ds")
    want = [str(root / "images/train/0.jpg"), str(root / "images/train/1.jpg")]
    text = "./images/train/0.jpg\r\n./images/train/1.jpg\r\n"
    for name, data in (("bom.txt", b"\xef\xbb\xbf" + text.encode()), ("u16.txt", text.encode("utf-16"))):
        (root / name).write_bytes(data)
        assert collect_image_files(root / name) == want, name
    latin = root / "latin.txt"
    latin.write_bytes(b"./images/train/caf\xe9.jpg\n")
    with pytest.raises(ImageListError) as e:
        collect_image_files(latin)
    assert str(e.value) == f"{latin}: not a UTF-8 text file (byte 18: b'\\xe9.jp'); save the list as UTF-8"
    from yolov9c.data.check import check_data
    lines = []
    y = _write(root / "d.yaml", {"path": ".", "train": "latin.txt", "val": "images/val", "names": ["a"]})
    assert check_data(y, log=lines.append, err=lines.append) == 2
    assert lines[-1] == f"error: train: {latin}: not a UTF-8 text file (byte 18: b'\\xe9.jp'); save the list as UTF-8"


@pytest.mark.parametrize("name", ["train.list", "trainval"])
def test_list_file_of_any_extension_is_a_list(tmp_path, name):
    # published: any file given as a split is a list of image paths (only our single image is not)
    from yolov9c.data.dataset import DatasetConfig, YoloDataset

    root = _tree(tmp_path / "ds")
    for i in range(2):
        (root / "labels/train").mkdir(parents=True, exist_ok=True)
        (root / "labels/train" / f"{i}.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (root / name).write_text("./images/train/0.jpg\n./images/train/1.jpg\n")
    assert collect_image_files(root / name) == [str(root / "images/train/0.jpg"), str(root / "images/train/1.jpg")]
    lines = []
    YoloDataset(str(root / name), DatasetConfig(img_size=64, nc=2), log=lines.append)
    assert lines == ["2 images, 0 backgrounds, 0 corrupt"]
    assert (root / name).with_suffix(".cache").is_file()  # next to the list, as published


@pytest.mark.parametrize("cfg, key", [
    ({"train": "images/train", "val": "images/nope", "names": ["a"]}, "'val'"),
    ({"train": "images/missing", "val": "images/val", "names": ["a"]}, "'train'"),
    ({"val": "images/val", "names": ["a"]}, "'train'"),
    ({"train": "images/train", "val": "images/val", "test": "images/zzz", "names": ["a"]}, "'test'"),
    ({"path": "no/such/root", "train": "images/train", "val": "images/val", "names": ["a"]}, "'path'"),
    ({"train": "images/train", "val": "images/val"}, "'names'"),
    ({"train": "images/train", "val": "images/val", "names": {0: "a", 2: "c"}}, "'names'"),
    ({"train": "images/train", "val": "images/val", "nc": "many", "names": ["a"]}, "'nc'"),
])
def test_errors_name_the_key(tmp_path, cfg, key):
    root = _tree(tmp_path / "ds")
    y = _write(root / "d.yaml", cfg)
    with pytest.raises(DataConfigError) as e:
        load_data_config(y)
    assert key in str(e.value) and str(y) in str(e.value)


def test_missing_yaml_and_nc_only(tmp_path):
    with pytest.raises(DataConfigError, match="not found"):
        load_data_config(tmp_path / "none.yaml")
    root = _tree(tmp_path / "ds")
    # no names: an error, as the published check_dataset stops ("data.yaml 'names:' field missing")
    with pytest.raises(DataConfigError, match=r"'names' is missing; it is required \(as in the published code.*"
                                              r"add e.g. names: \['0', '1'\]"):
        load_data_config(_write(root / "d.yaml", {"train": "images/train", "val": "images/val", "nc": 2}))


def test_unreadable_yaml_is_one_line(tmp_path):
    # a Latin-1 file and a broken flow list: one line naming the file (no UnicodeDecodeError traceback,
    # no 6-line PyYAML text quoting "<unicode string>")
    root = _tree(tmp_path / "ds")
    latin = root / "latin.yaml"
    latin.write_bytes(b"train: images/train\nval: images/val\nnames: [caf\xe9, b]\n")
    with pytest.raises(DataConfigError) as e:
        load_data_config(latin)
    assert str(e.value) == f"{latin}: not a UTF-8 text file (byte 47: b'\\xe9, b'); save it as UTF-8"
    broken = root / "broken.yaml"
    broken.write_text("train: images/train\nval: images/val\nnames: [a, b\n")
    with pytest.raises(DataConfigError) as e:
        load_data_config(broken)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{broken}: line 3: not valid yaml (")


def test_gif_in_a_folder_is_named_once(tmp_path):
    # not a training format (as published: no gif in the formats list): ignored, and one warning names it
    from yolov9c.data.dataset import YoloDataset, DatasetConfig
    from yolov9c.data.image_list import collect_image_files

    root = _tree(tmp_path / "ds")
    train = root / "images" / "train"
    (train / "anim.gif").write_bytes(b"GIF89a")
    (train / "notes.md").write_text("not an image")
    ignored = []
    files = collect_image_files(str(train), ignored)
    assert ignored == [str(train / "anim.gif")] and not any(f.endswith((".gif", ".md")) for f in files)
    lines = []
    YoloDataset(str(train), DatasetConfig(img_size=64, nc=2), log=lines.append)
    warn = [ln for ln in lines if "anim.gif" in ln]
    assert len(warn) == 1 and warn[0].startswith("WARNING: 1 image file ignored, in a format training does not "
                                                 "read (accepted: bmp,"), lines


def test_relative_root_falls_back_to_current_folder(tmp_path, monkeypatch):
    # the published convention: `path: ../datasets/x` relative to where you run
    root = _tree(tmp_path / "datasets" / "x")
    ydir = tmp_path / "cfgs"
    ydir.mkdir()
    y = _write(ydir / "x.yaml", {"path": "datasets/x", "train": "images/train", "val": "images/val",
                                 "names": ["a"]})
    monkeypatch.chdir(tmp_path)
    assert load_data_config(y)["path"] == str(root.resolve())


def test_a_missing_relative_root_names_both_places_looked_in(tmp_path, monkeypatch):
    # `path: datasets/x` is looked for beside the yaml, then in the current folder: the error names both
    ydir = tmp_path / "cfgs"
    ydir.mkdir()
    y = _write(ydir / "x.yaml", {"path": "datasets/x", "train": "images/train", "val": "images/val", "names": ["a"]})
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    with pytest.raises(DataConfigError) as e:
        load_data_config(y)
    assert str(e.value).endswith(f"'path': dataset root not found: {(ydir / 'datasets' / 'x').resolve()} nor "
                                 f"{(run / 'datasets' / 'x').resolve()}"), str(e.value)


def test_roboflow_export_layout(tmp_path):
    # a Roboflow zip export: data.yaml beside train/ valid/ test/, each split given as '../<split>/images';
    # as published, a '../x' that does not exist is read as 'x' (the roboflow: block is not ours to read)
    root = tmp_path / "export"
    for split in ("train", "valid", "test"):
        _img(root / split / "images" / "a.jpg")
    y = root / "data.yaml"
    y.write_text("train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 2\n"
                 "names: ['head', 'helmet']\n\nroboflow:\n  workspace: ws\n  version: 1\n"
                 "  url: https://universe.roboflow.com/ws/p/dataset/1\n")
    cfg = load_data_config(y)
    assert [cfg[k] for k in ("train", "val", "test")] == [[str(root.resolve() / s / "images")]
                                                          for s in ("train", "valid", "test")]
    assert label_path_for(Path(cfg["val"][0]) / "a.jpg") == str(root.resolve() / "valid" / "labels" / "a.txt")
    # a '../x' that exists is taken as written
    _img(tmp_path / "train" / "images" / "b.jpg")
    assert load_data_config(y)["train"] == [str(root.resolve() / "../train/images")]


def test_only_the_splits_a_run_reads_must_exist(tmp_path):
    # published: check_dataset looks for val only, so training runs without the test images (coco.yaml's
    # test-dev2017.txt) and val_dual.py without the train images; check-data (all splits) still stops
    root = _tree(tmp_path / "ds")
    y = _write(root / "d.yaml", {"train": "images/not_downloaded", "val": "images/val", "test": "test-dev.txt",
                                 "names": ["a"]})
    cfg = load_data_config(y, splits=("val",))
    assert cfg["val"] == [str(root.resolve() / "images/val")]
    assert cfg["train"] == [str(root.resolve() / "images/not_downloaded")]  # resolved, unchecked
    with pytest.raises(DataConfigError, match="'test': path not found"):
        load_data_config(y, splits=("val", "test"))
    with pytest.raises(DataConfigError, match="'train': path not found"):
        load_data_config(y, splits=("train", "val"))
    with pytest.raises(DataConfigError, match="'train': path not found"):
        load_data_config(y)


@pytest.mark.parametrize("cfg, key", [
    ({"path": "../datasets/coco", "train": "train2017.txt", "val": "val2017.txt"}, "'path'"),
    ({"train": "images/train", "val": "val2017.txt"}, "'val'"),
])
def test_a_dataset_to_download_says_to_get_it_first(tmp_path, cfg, key):
    # published yamls (coco.yaml) carry a download: script, which we never run: the error says so
    root = _tree(tmp_path / "ds")
    y = _write(root / "coco.yaml", {**cfg, "names": ["a"], "download": "from utils.general import download\n"})
    with pytest.raises(DataConfigError) as e:
        load_data_config(y)
    msg = str(e.value)
    assert key in msg and msg.endswith("; this yaml's download: is not run here: get the dataset first (with the "
                                       "published repo's script or by hand)"), msg
    del cfg["val"]  # no download key: the plain message
    with pytest.raises(DataConfigError) as e:
        load_data_config(_write(root / "plain.yaml", {**cfg, "val": "images/nope", "names": ["a"]}))
    assert "is not run here" not in str(e.value)


def test_label_pairing():
    assert label_path_for("/d/images/train/a.jpg") == "/d/labels/train/a.txt"
    # the LAST /images/ is replaced, as published
    assert label_path_for("/images/x/images/b.PNG") == "/images/x/labels/b.txt"
    assert label_path_for("/d/pics/c.jpeg") == "/d/pics/c.txt"


def test_coco24_yaml():
    cfg = load_data_config(COCO24 / "data.yaml")
    assert cfg["nc"] == 80 and cfg["names"][0] == "person" and cfg["names"][79] == "toothbrush"
    assert cfg["train"] == [str((COCO24 / "images" / "train").resolve())]  # `path: .` is the yaml's own folder
    jpgs = sorted(str(p) for p in Path(cfg["train"][0]).glob("*.jpg"))
    assert len(jpgs) >= 10 and collect_image_files(cfg["train"]) == jpgs


def test_an_nc_that_is_not_the_number_of_names_gives_way_to_the_names_with_a_warning(tmp_path):
    root = _tree(tmp_path / "ds")
    y = _write(root / "d.yaml", {"train": "images/train", "val": "images/val", "nc": 80, "names": ["a", "b"]})
    lines = []
    cfg = load_data_config(y, log=lines.append)
    assert cfg["nc"] == 2 and cfg["names"] == ["a", "b"]  # published: nc = len(names)
    assert len(lines) == 1 and lines[0].startswith("WARNING: ") and "'nc' is 80" in lines[0] and "nc=2" in lines[0]
    lines.clear()
    _write(root / "d.yaml", {"train": "images/train", "val": "images/val", "nc": 2, "names": ["a", "b"]})
    assert load_data_config(y, log=lines.append)["nc"] == 2 and lines == []
