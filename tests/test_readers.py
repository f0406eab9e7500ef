"""Real-dataset readers on tiny trees written in each published layout."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedvlp.data.images import ArrayImages, FileImages, GeneratedImages, ImageSource
from fedvlp.data.readers import (
    MMIMDB_GENRES,
    READERS,
    VOC_CLASSES,
    Dataset,
    read_coco2014,
    read_food101,
    read_mmimdb,
    read_nuswide,
    read_voc2007,
)
from fedvlp.data.recipes import generate_recipes
from fedvlp.data.scenes import generate_scenes
from fedvlp.errors import ConfigError, DataError

COLOURS = [(220, 30, 30), (30, 200, 40), (20, 40, 210), (240, 220, 20), (200, 40, 200), (20, 200, 200),
           (128, 128, 128), (250, 250, 250)]


def write_image(path: Path, colour, size=(24, 16)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, quality=95)
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_json(path: Path, obj) -> Path:
    return write_text(path, json.dumps(obj))


def rows(num_classes: int, positives: list[list[int]], unknown: list[list[int]] | None = None) -> np.ndarray:
    """Expected multi-hot rows: 1 at `positives`, -1 at `unknown`."""
    out = np.zeros((len(positives), num_classes), np.int8)
    for i, cols in enumerate(positives):
        out[i, cols] = 1
    for i, cols in enumerate(unknown or []):
        out[i, cols] = -1
    return out


def assert_one_line_error(exc_info, *parts):
    message = str(exc_info.value)
    assert "\n" not in message
    for part in parts:
        assert str(part) in message, (part, message)


def colour_of(batch: np.ndarray) -> np.ndarray:
    return batch.reshape(len(batch), -1, 3).mean(axis=1)


# --------------------------------------------------------------------------- VOC2007

VOC_TRAIN = {   # id -> [(class, difficult or None = no <difficult> tag)]
    "000001": [("dog", 0), ("person", 0)],
    "000002": [("cat", 1)],
    "000003": [("car", 1), ("car", 0)],
    "000004": [("aeroplane", 0), ("tvmonitor", 1), ("tvmonitor", 1)],
}
VOC_TEST = {
    "000005": [("bird", 0)],
    "000006": [("sofa", None)],
    "000007": [("train", 1), ("person", 0)],
}


def voc_xml(objects) -> str:
    parts = []
    for name, difficult in objects:
        tag = "" if difficult is None else f"<difficult>{difficult}</difficult>"
        parts.append(f"<object><name>{name}</name><pose>Unspecified</pose>{tag}"
                     f"<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>")
    size = "<size><width>24</width><height>16</height></size>"
    return f"<annotation><folder>VOC2007</folder>{size}{''.join(parts)}</annotation>"


def voc_tree(tmp: Path) -> Path:
    """A tiny VOC2007 tree in the published layout under tmp/voc; returns its root."""
    voc = tmp / "voc" / "VOCdevkit" / "VOC2007"
    for k, (split, ids) in enumerate([("trainval", VOC_TRAIN), ("test", VOC_TEST)]):
        write_text(voc / "ImageSets" / "Main" / f"{split}.txt", "".join(f"{i}\n" for i in ids))
        for j, (image_id, objects) in enumerate(ids.items()):
            write_text(voc / "Annotations" / f"{image_id}.xml", voc_xml(objects))
            write_image(voc / "JPEGImages" / f"{image_id}.jpg", COLOURS[(4 * k + j) % len(COLOURS)])
    return tmp / "voc"


@pytest.fixture
def voc_root(tmp_path):
    return voc_tree(tmp_path)


def test_voc2007_classes_splits_and_labels(voc_root):
    ds = read_voc2007(voc_root)
    assert isinstance(ds, Dataset) and ds.name == "voc2007" and ds.multilabel
    assert len(ds.class_names) == 20 and ds.class_names[0] == "aeroplane" and ds.class_names[-1] == "tvmonitor"
    assert (len(ds.train.images), len(ds.test.images)) == (4, 3)
    c = VOC_CLASSES.index
    expected_train = rows(20, [[c("dog"), c("person")], [], [c("car")], [c("aeroplane")]],
                          [[], [c("cat")], [], [c("tvmonitor")]])
    expected_test = rows(20, [[c("bird")], [c("sofa")], [c("person")]], [[], [], [c("train")]])
    assert ds.train.labels.dtype == np.int8
    np.testing.assert_array_equal(ds.train.labels, expected_train)
    np.testing.assert_array_equal(ds.test.labels, expected_test)
    assert ds.train.texts is None and ds.test.texts is None
    assert ds.train.images.paths[1].endswith(os.path.join("JPEGImages", "000002.jpg"))


def test_voc2007_root_may_be_the_voc2007_folder(voc_root):
    direct = read_voc2007(voc_root / "VOCdevkit" / "VOC2007")
    np.testing.assert_array_equal(direct.test.labels, read_voc2007(voc_root).test.labels)


def test_voc2007_lazy_images_load_with_their_colour(voc_root):
    images = read_voc2007(voc_root).train.images
    assert isinstance(images, ImageSource)
    batch = images.load([0, 2, 3], 8)
    assert batch.dtype == np.uint8 and batch.shape == (3, 8, 8, 3)
    np.testing.assert_allclose(colour_of(batch), [COLOURS[0], COLOURS[2], COLOURS[3]], atol=4)


def test_voc2007_not_a_tree(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as e:
        read_voc2007(tmp_path / "empty")
    assert_one_line_error(e, tmp_path / "empty", "not a VOC2007 tree", "ImageSets/Main/trainval.txt")


def test_voc2007_xml_without_name(voc_root):
    xml = voc_root / "VOCdevkit" / "VOC2007" / "Annotations" / "000006.xml"
    xml.write_text("<annotation><object><difficult>0</difficult></object></annotation>")
    with pytest.raises(DataError) as e:
        read_voc2007(voc_root)
    assert_one_line_error(e, xml, "<object><name>", "expected a VOC annotation")


def test_voc2007_unknown_class_and_malformed_xml(voc_root):
    xml = voc_root / "VOCdevkit" / "VOC2007" / "Annotations" / "000002.xml"
    xml.write_text(voc_xml([("unicorn", 0)]))
    with pytest.raises(DataError) as e:
        read_voc2007(voc_root)
    assert_one_line_error(e, xml, "'unicorn'")
    xml.write_text("<annotation><object>")
    with pytest.raises(DataError) as e:
        read_voc2007(voc_root)
    assert_one_line_error(e, xml, "malformed XML")


# --------------------------------------------------------------------------- COCO2014

COCO_IDS = [1, 2, 4, 5, 7, 9, 13, 14, 17, 21] + list(range(30, 100))[:70]   # 80 non-contiguous ids
COCO_TRAIN_IMAGES = [10, 5, 42, 7]                 # JSON order; 42 has no annotation
COCO_TRAIN_ANNS = [(10, 0), (10, 0), (10, 5), (5, 79), (7, 3), (7, 12)]   # (image id, category rank)
COCO_VAL_IMAGES = [3, 1, 2]
COCO_VAL_ANNS = [(1, 40), (3, 1), (3, 78)]


def coco_json(images, anns):
    rng = np.random.default_rng(0)
    # Ranks by id are cat0..cat79; listed shuffled so neither JSON order nor name order is id order.
    categories = [{"id": COCO_IDS[k], "name": f"cat{k}", "supercategory": "thing"}
                  for k in rng.permutation(80)]
    return {
        "info": {}, "licenses": [], "categories": categories,
        "images": [{"id": i, "file_name": f"COCO_x_{i:012d}.jpg", "width": 24, "height": 16} for i in images],
        "annotations": [{"id": n, "image_id": i, "category_id": COCO_IDS[k], "iscrowd": 0, "bbox": [0, 0, 1, 1]}
                        for n, (i, k) in enumerate(anns)],
    }


@pytest.fixture
def coco_root(tmp_path):
    root = tmp_path / "coco"
    for split, images, anns in [("train2014", COCO_TRAIN_IMAGES, COCO_TRAIN_ANNS),
                                ("val2014", COCO_VAL_IMAGES, COCO_VAL_ANNS)]:
        write_json(root / "annotations" / f"instances_{split}.json", coco_json(images, anns))
        for j, i in enumerate(images):
            write_image(root / split / f"COCO_x_{i:012d}.jpg", COLOURS[j])
    return root


def test_coco2014_classes_sorted_by_id(coco_root):
    ds = read_coco2014(coco_root)
    assert ds.name == "coco2014" and ds.multilabel
    assert ds.class_names == tuple(f"cat{k}" for k in range(80))


def test_coco2014_splits_and_labels(coco_root):
    ds = read_coco2014(coco_root)
    assert (len(ds.train.images), len(ds.test.images)) == (4, 3)
    np.testing.assert_array_equal(ds.train.labels, rows(80, [[0, 5], [79], [], [3, 12]]))
    np.testing.assert_array_equal(ds.test.labels, rows(80, [[1, 78], [40], []]))
    assert ds.train.labels.dtype == np.int8 and ds.train.texts is None
    assert ds.test.images.paths[0] == str(coco_root / "val2014" / "COCO_x_000000000003.jpg")
    np.testing.assert_allclose(colour_of(ds.train.images.load([1], 6)), [COLOURS[1]], atol=4)


def test_coco2014_missing_annotations_key(coco_root):
    path = coco_root / "annotations" / "instances_val2014.json"
    data = json.loads(path.read_text())
    del data["annotations"]
    write_json(path, data)
    with pytest.raises(DataError) as e:
        read_coco2014(coco_root)
    assert_one_line_error(e, path, "missing key 'annotations'", "expected a COCO instances file")


def test_coco2014_unknown_category_and_image(coco_root):
    path = coco_root / "annotations" / "instances_train2014.json"
    data = json.loads(path.read_text())
    data["annotations"][2]["category_id"] = 1000
    write_json(path, data)
    with pytest.raises(DataError) as e:
        read_coco2014(coco_root)
    assert_one_line_error(e, path, "annotations[2]", "category_id 1000")
    data["annotations"][2]["category_id"] = COCO_IDS[0]
    data["annotations"][4]["image_id"] = 999
    write_json(path, data)
    with pytest.raises(DataError) as e:
        read_coco2014(coco_root)
    assert_one_line_error(e, path, "annotations[4]", "image_id 999")


# --------------------------------------------------------------------------- NUS-WIDE

NUS_CONCEPTS = ["airport", "animal", "beach"] + [f"concept{i:02d}" for i in range(78)]
NUS_TRAIN = ["actor\\0001_2124494179.jpg", "actor\\0002_174174086.jpg", "beach\\0001_1.jpg", "beach\\0002_2.jpg"]
NUS_TEST = ["zebra\\0001_9.jpg", "zebra\\0002_8.jpg", "airport\\0001_7.jpg"]


def nus_labels(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random((n, 81)) < 0.3).astype(np.int8)


@pytest.fixture
def nus_root(tmp_path):
    root = tmp_path / "nus"
    write_text(root / "Concepts81.txt", "".join(f"{c}\n" for c in NUS_CONCEPTS))
    for k, (split, names) in enumerate([("Train", NUS_TRAIN), ("Test", NUS_TEST)]):
        write_text(root / "ImageList" / f"{split}Imagelist.txt", "\r\n".join(names) + "\r\n")
        labels = nus_labels(len(names), k)
        for c, concept in enumerate(NUS_CONCEPTS):
            # Real label files carry trailing spaces / CRLF on some lines.
            write_text(root / "Groundtruth" / "TrainTestLabels" / f"Labels_{concept}_{split}.txt",
                       "".join(f"{v} \r\n" if c % 2 else f"{v}\n" for v in labels[:, c]))
        for j, name in enumerate(names):
            write_image(root / "Flickr" / name.replace("\\", "/"), COLOURS[j + 2])
    return root


def test_nuswide_concepts_splits_and_labels(nus_root):
    ds = read_nuswide(nus_root)
    assert ds.name == "nuswide" and ds.multilabel
    assert ds.class_names == tuple(NUS_CONCEPTS) and len(ds.class_names) == 81
    assert (len(ds.train.images), len(ds.test.images)) == (4, 3)
    np.testing.assert_array_equal(ds.train.labels, nus_labels(4, 0))
    np.testing.assert_array_equal(ds.test.labels, nus_labels(3, 1))
    assert ds.train.labels.dtype == np.int8 and ds.train.texts is None


def test_nuswide_backslash_paths_resolve_under_flickr(nus_root):
    images = read_nuswide(nus_root).train.images
    assert images.paths[0] == str(nus_root / "Flickr" / "actor" / "0001_2124494179.jpg")
    np.testing.assert_allclose(colour_of(images.load([3, 0], 10)), [COLOURS[5], COLOURS[2]], atol=4)


def test_nuswide_label_file_wrong_line_count(nus_root):
    path = nus_root / "Groundtruth" / "TrainTestLabels" / "Labels_beach_Test.txt"
    path.write_text("0\n1\n")
    with pytest.raises(DataError) as e:
        read_nuswide(nus_root)
    assert_one_line_error(e, path, "2 lines", "expected 3 lines")


def test_nuswide_label_value_not_binary(nus_root):
    path = nus_root / "Groundtruth" / "TrainTestLabels" / "Labels_animal_Train.txt"
    path.write_text("0\n1\n2\n0\n")
    with pytest.raises(DataError) as e:
        read_nuswide(nus_root)
    assert_one_line_error(e, path, "line 3", "'2'")


# --------------------------------------------------------------------------- UPMC Food-101

FOOD_CLASSES = sorted(["apple_pie", "pizza", "ramen", "sushi"] + [f"dish_{i:03d}" for i in range(97)])
FOOD_TRAIN = [("pizza_1.jpg", "best pizza ever", "pizza"), ("sushi_1.jpg", "sushi night", "sushi"),
              ("pizza_2.jpg", '"cheese, tomato"', "pizza"), ("apple_pie_1.jpg", "grandma pie", "apple_pie"),
              ("ramen_1.jpg", "hot ramen", "ramen"), ("sushi_2.jpg", "maki, nigiri", "sushi"),
              ("apple_pie_2.jpg", "pie", "apple_pie"), ("pizza_3.jpg", "margherita", "pizza")]
FOOD_TEST = [("ramen_9.jpg", "tonkotsu", "ramen"), ("apple_pie_9.jpg", "tart", "apple_pie"),
             ("pizza_9.jpg", "slice", "pizza"), ("sushi_9.jpg", "salmon", "sushi")]


@pytest.fixture
def food_root(tmp_path):
    root = tmp_path / "food"
    for name in FOOD_CLASSES:
        (root / "images" / "train" / name).mkdir(parents=True)
    for split, samples in [("train", FOOD_TRAIN), ("test", FOOD_TEST)]:
        # Unquoted commas inside a title (sushi_2) and a quoted one (pizza_2).
        write_text(root / "texts" / f"{split}_titles.csv", "".join(f"{f},{t},{c}\n" for f, t, c in samples))
        for j, (f, _, c) in enumerate(samples):
            write_image(root / "images" / split / c / f, COLOURS[j % len(COLOURS)])
    return root


def test_food101_classes_labels_and_texts(food_root):
    ds = read_food101(food_root)
    assert ds.name == "food101" and not ds.multilabel
    assert len(ds.class_names) == 101 and ds.class_names == tuple(FOOD_CLASSES)
    assert (len(ds.train.images), len(ds.test.images)) == (8, 4)
    assert ds.train.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train.labels, [FOOD_CLASSES.index(c) for _, _, c in FOOD_TRAIN])
    np.testing.assert_array_equal(ds.test.labels, [FOOD_CLASSES.index(c) for _, _, c in FOOD_TEST])
    assert ds.train.texts[:3] == ("best pizza ever", "sushi night", "cheese, tomato")
    assert ds.train.texts[5] == "maki, nigiri"
    assert ds.test.images.paths[1] == str(food_root / "images" / "test" / "apple_pie" / "apple_pie_9.jpg")
    np.testing.assert_allclose(colour_of(ds.test.images.load([2], 12)), [COLOURS[2]], atol=4)


def test_food101_top_k_keeps_most_frequent_and_relabels(food_root):
    # Train counts: pizza 3, apple_pie 2, sushi 2, ramen 1 -> top 2 = pizza, apple_pie (tie by name).
    ds = read_food101(food_root, top_k=2)
    assert ds.class_names == ("pizza", "apple_pie")
    np.testing.assert_array_equal(ds.train.labels, [0, 0, 1, 1, 0])
    assert ds.train.texts == ("best pizza ever", "cheese, tomato", "grandma pie", "pie", "margherita")
    np.testing.assert_array_equal(ds.test.labels, [1, 0])
    assert ds.test.texts == ("tart", "slice")
    assert [Path(p).name for p in ds.test.images.paths] == ["apple_pie_9.jpg", "pizza_9.jpg"]
    assert read_food101(food_root, top_k=3).class_names == ("pizza", "apple_pie", "sushi")
    with pytest.raises(ConfigError):
        read_food101(food_root, top_k=0)


def test_food101_unknown_class_in_csv(food_root):
    path = food_root / "texts" / "test_titles.csv"
    path.write_text("x.jpg,some text,burrito\n")
    with pytest.raises(DataError) as e:
        read_food101(food_root)
    assert_one_line_error(e, path, "line 1", "'burrito'")


# --------------------------------------------------------------------------- MM-IMDB

IMDB_TRAIN = {   # id -> genres
    "t01": ["Horror"], "t02": ["Horror"], "t03": ["Horror"], "t04": ["War"], "t05": ["War"],
    "t06": ["Western"], "t07": ["Western"], "t08": ["Sport"], "t09": ["Music"], "t10": ["Musical"],
    "t11": ["History"], "t12": ["Family"], "t13": ["Action"],
    # Multi-genre movies: Drama would be the most frequent genre if they were not excluded.
    "t14": ["Drama", "Comedy"], "t15": ["Drama", "Romance"], "t16": ["Comedy", "Drama"],
    "t17": ["Drama", "Talk-Show"],        # a non-standard genre is dropped -> single-genre Drama
}
IMDB_TEST = {"s1": ["Horror"], "s2": ["Drama"], "s3": ["Comedy", "Drama"], "s4": ["Sport"],
             "s5": ["Action"], "s6": ["Western"]}
IMDB_DEV = {"d1": ["War"], "d2": ["Horror", "Drama"], "d3": ["Western"]}


@pytest.fixture
def imdb_root(tmp_path):
    root = tmp_path / "imdb"
    write_json(root / "split.json", {"train": list(IMDB_TRAIN), "dev": list(IMDB_DEV), "test": list(IMDB_TEST)})
    for j, (movie, genres) in enumerate({**IMDB_TRAIN, **IMDB_TEST, **IMDB_DEV}.items()):
        write_json(root / "dataset" / f"{movie}.json",
                   {"title": movie, "genres": genres, "plot": [f"plot of {movie}", "second plot"]})
        write_image(root / "dataset" / f"{movie}.jpeg", COLOURS[j % len(COLOURS)], size=(12, 18))
    return root


def test_mmimdb_multilabel(imdb_root):
    ds = read_mmimdb(imdb_root)
    assert ds.name == "mmimdb" and ds.multilabel
    assert ds.class_names == MMIMDB_GENRES and len(ds.class_names) == 23
    assert (len(ds.train.images), len(ds.test.images)) == (17, 6)
    g = MMIMDB_GENRES.index
    expected = rows(23, [[g(x) for x in genres if x in MMIMDB_GENRES] for genres in IMDB_TRAIN.values()])
    np.testing.assert_array_equal(ds.train.labels, expected)
    np.testing.assert_array_equal(ds.test.labels[2], rows(23, [[g("Comedy"), g("Drama")]])[0])
    assert ds.train.texts[0] == "plot of t01" and ds.test.texts == tuple(f"plot of {m}" for m in IMDB_TEST)
    assert ds.test.images.paths[4] == str(imdb_root / "dataset" / "s5.jpeg")
    np.testing.assert_allclose(colour_of(ds.train.images.load([1], 9)), [COLOURS[1]], atol=4)
    assert ds.val.texts == tuple(f"plot of {m}" for m in IMDB_DEV)  # val is the official dev split


def test_mmimdb_fedprime_protocol(imdb_root):
    ds = read_mmimdb(imdb_root, protocol="fedprime")
    # Single-genre train counts: Horror 3, War 2, Western 2, then 1 each for Action, Drama (t17), Family,
    # History, Music, Musical, Sport; ties by name -> Musical and Sport are left out. Counting the
    # multi-genre movies would put Drama (4) first.
    assert not ds.multilabel
    assert ds.class_names == ("Horror", "War", "Western", "Action", "Drama", "Family", "History", "Music")
    assert ds.train.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.train.labels, [0, 0, 0, 1, 1, 2, 2, 7, 6, 5, 3, 4])
    assert ds.train.texts[-1] == "plot of t17" and len(ds.train.images) == 12
    np.testing.assert_array_equal(ds.test.labels, [0, 4, 3, 2])
    assert ds.test.texts == ("plot of s1", "plot of s2", "plot of s5", "plot of s6")
    assert Path(ds.test.images.paths[2]).name == "s5.jpeg"
    np.testing.assert_array_equal(ds.val.labels, [1, 2])  # dev: the single-genre War and Western movies
    with pytest.raises(ConfigError):
        read_mmimdb(imdb_root, protocol="single")


def test_readers_are_registered_with_their_options(food_root, imdb_root):
    from fedvlp.config import load_spec
    from fedvlp.data import load_dataset

    spec = load_spec("fedprime_food101", [f"data.root={food_root}", "data.options={top_k: 2}"])
    assert spec.data.options.top_k == 2 and len(load_dataset(spec).class_names) == 2
    spec = load_spec("fedprime_mmimdb", [f"data.root={imdb_root}"])
    assert load_dataset(spec).val.labels.tolist() == [1, 2]
    with pytest.raises(ConfigError, match=r"data\.options\.top_k: expected a value >= 1, got 0"):
        load_spec("fedprime_food101", [f"data.root={food_root}", "data.options={top_k: 0}"])
    with pytest.raises(ConfigError, match=r"data\.options\.bogus: unknown key"):
        load_spec("fedprime_mmimdb", [f"data.root={imdb_root}", "data.options={bogus: 1}"])


def test_mmimdb_movie_missing_plot(imdb_root):
    path = imdb_root / "dataset" / "s3.json"
    write_json(path, {"genres": ["Drama"]})
    with pytest.raises(DataError) as e:
        read_mmimdb(imdb_root)
    assert_one_line_error(e, path, "'plot'")


# --------------------------------------------------------------------------- errors common to all readers

@pytest.mark.parametrize("name", sorted(READERS))
def test_missing_root(tmp_path, name):
    root = tmp_path / "nowhere"
    with pytest.raises(DataError) as e:
        READERS[name](root)
    assert_one_line_error(e, root, "no such directory", "expected")


@pytest.mark.parametrize("fixture, relative", [
    ("voc_root", "VOCdevkit/VOC2007/ImageSets/Main/test.txt"),
    ("nus_root", "ImageList/TestImagelist.txt"),
    ("coco_root", "annotations/instances_val2014.json"),
    ("food_root", "texts/test_titles.csv"),
    ("imdb_root", "split.json"),
])
def test_missing_image_list(request, fixture, relative):
    root = request.getfixturevalue(fixture)
    (root / relative).unlink()
    reader = {"voc_root": read_voc2007, "nus_root": read_nuswide, "coco_root": read_coco2014,
              "food_root": read_food101, "imdb_root": read_mmimdb}[fixture]
    with pytest.raises(DataError) as e:
        reader(root)
    assert_one_line_error(e, root / relative, "missing", "expected")


def test_corrupt_jpeg_fails_at_load_not_at_read(voc_root):
    jpeg = voc_root / "VOCdevkit" / "VOC2007" / "JPEGImages" / "000002.jpg"
    good = jpeg.read_bytes()
    jpeg.write_bytes(b"\x00garbage bytes, not an image" * 10)
    images = read_voc2007(voc_root).train.images      # reading never opens images
    images.load([0], 8)
    with pytest.raises(DataError) as e:
        images.load([0, 1], 8)
    assert_one_line_error(e, jpeg, "cannot read image", "expected a JPEG/PNG file")
    jpeg.write_bytes(good[: len(good) // 2])           # truncated JPEG
    with pytest.raises(DataError) as e:
        images.load([1], 8)
    assert_one_line_error(e, jpeg, "cannot read image")
    jpeg.unlink()
    with pytest.raises(DataError) as e:
        images.load([1], 8)
    assert_one_line_error(e, jpeg, "cannot read image")


# --------------------------------------------------------------------------- image sources

def test_file_images_resize_shorter_side_then_centre_crop(tmp_path):
    # 60x30 image: red | green | blue thirds. Shorter side -> 16 gives 32x16; the centre crop is green.
    array = np.zeros((30, 60, 3), np.uint8)
    array[:, :20] = (255, 0, 0)
    array[:, 20:40] = (0, 255, 0)
    array[:, 40:] = (0, 0, 255)
    Image.fromarray(array).save(tmp_path / "wide.png")
    Image.fromarray(np.ascontiguousarray(array.transpose(1, 0, 2))).save(tmp_path / "tall.png")
    images = FileImages((str(tmp_path / "wide.png"), tmp_path / "tall.png"))
    assert len(images) == 2 and isinstance(images.paths[1], str)
    batch = images.load(np.array([0, 1]), 16)
    assert batch.shape == (2, 16, 16, 3) and batch.dtype == np.uint8
    assert np.all(batch[:, 6:10, 6:10] == (0, 255, 0))
    assert batch[0, 8, 0, 0] > 100 and batch[0, 8, 15, 2] > 100       # thirds still visible at the edges
    assert batch[1, 0, 8, 0] > 100 and batch[1, 15, 8, 2] > 100
    assert images.load([], 16).shape == (0, 16, 16, 3)


def test_file_images_cache_key_tracks_files(tmp_path):
    a = write_image(tmp_path / "a.jpg", COLOURS[0])
    b = write_image(tmp_path / "b.jpg", COLOURS[1])
    images = FileImages((str(a), str(b)))
    key = images.cache_key()
    assert key == FileImages((str(a), str(b))).cache_key()
    assert key != FileImages((str(b), str(a))).cache_key()
    stat = a.stat()
    write_image(a, COLOURS[2], size=(64, 64))                 # new content and size, same mtime
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert images.cache_key() != key
    key = images.cache_key()
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))   # touched only
    assert images.cache_key() != key
    a.unlink()
    with pytest.raises(DataError) as e:
        images.cache_key()
    assert_one_line_error(e, a)


def test_array_images_load_and_cache_key():
    array = np.zeros((3, 8, 8, 3), np.uint8)
    array[1] = COLOURS[3]
    images = ArrayImages(array)
    assert len(images) == 3 and isinstance(images, ImageSource)
    np.testing.assert_array_equal(images.load([1, 0], 8), array[[1, 0]])
    resized = images.load([1], 16)
    assert resized.shape == (1, 16, 16, 3) and resized.dtype == np.uint8
    np.testing.assert_allclose(colour_of(resized), [COLOURS[3]], atol=1)
    changed = array.copy()
    changed[2, 7, 7, 2] = 1                                   # one byte, far from any stride sample start
    assert ArrayImages(changed).cache_key() != images.cache_key()
    assert ArrayImages(array.copy()).cache_key() == images.cache_key()
    assert ArrayImages(array.reshape(3, 4, 16, 3)).cache_key() != images.cache_key()
    with pytest.raises(DataError):
        ArrayImages(array.astype(np.float32))


@pytest.mark.parametrize("generate", [generate_scenes, generate_recipes])
def test_generated_images_render_where_loaded_the_pixels_of_the_generator(generate):
    """A synthetic split carries its generator's arguments, not pixels: the driver of a run whose features are
    cached never renders them; loading renders exactly what the generator draws, subsets included."""
    import pickle

    images = GeneratedImages(generate, 70, "test", 3)
    drawn = generate(70, "test", 3)
    bare = generate(70, "test", 3, render=False)  # everything but the pixels, the same draws
    assert bare.images.shape == (70, 0, 0, 3) and np.array_equal(bare.labels, drawn.labels)
    assert len(images) == 70 and isinstance(images, ImageSource) and not images._rendered
    shipped = pickle.loads(pickle.dumps(images))  # as Ray sends it to a worker
    np.testing.assert_array_equal(shipped.load(range(70), 32), drawn.images)
    rows = np.array([5, 60, 2])
    subset = images.subset(rows)
    np.testing.assert_array_equal(subset.load([2, 0], 32), drawn.images[rows[[2, 0]]])
    np.testing.assert_array_equal(subset.subset(np.array([1])).load([0], 32), drawn.images[[60]])
    # keys: the same generator call gives the same key, any other argument or subset another
    keys = {images.cache_key(), GeneratedImages(generate, 71, "test", 3).cache_key(),
            GeneratedImages(generate, 70, "val", 3).cache_key(), GeneratedImages(generate, 70, "test", 4).cache_key(),
            subset.cache_key(), images.subset(rows[::-1]).cache_key()}
    assert len(keys) == 6 and images.cache_key() == GeneratedImages(generate, 70, "test", 3).cache_key()
