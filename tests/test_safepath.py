"""Extraction names from images are validated before anything touches the host
(ipuos._safepath)."""

from __future__ import annotations

import os

import pytest

from ipuos._safepath import NAME_MAX, PATH_MAX, UnsafePathError, check_name, open_beneath, safe_path

TRAVERSALS = [
    "..",
    "../x",
    "../../etc/passwd",
    "a/../../x",
    "a/b/../../../x",
    "a/..",
    "/etc/passwd",
    "/",
    "//x",
    ".",
    "./x",
    "a/./b",
    "a/.",
    "",
    "a//b",
    "a/",
    "x\0y",
    "x/\0/../y",
    "\0",
    "a\nb",
    "\x1b[31mred",
    "x" * (NAME_MAX + 1),
    "a/" + "é" * 128,  # 256 bytes in UTF-8
    "/".join(["d" * 200] * 21),  # > PATH_MAX overall
    b"../bytes",
    b"ok/\xff/../..",
    "\udcff/../x",
]


def _snapshot(root):
    """Every path under ``root`` with its type, size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def box(tmp_path):
    """``tmp_path/parent/dest`` with a secret beside dest and a symlink inside it
    pointing out."""
    parent = tmp_path / "parent"
    dest = parent / "dest"
    dest.mkdir(parents=True)
    (parent / "secret").write_text("keep me")
    (dest / "inside").mkdir()
    (dest / "file").write_text("f")
    os.symlink(parent, dest / "out")  # a symlink already present, pointing outside
    os.symlink(dest / "inside", dest / "in")  # and one pointing inside
    os.symlink(parent / "secret", dest / "secretlink")
    return parent, dest


def _extract(dest, name, data=b"pwned"):
    """What an extractor does: validate, then create."""
    target = safe_path(dest, name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
    return target


@pytest.mark.parametrize("name", TRAVERSALS)
def test_traversal_names_are_refused_and_the_parent_is_unchanged(box, name):
    parent, dest = box
    before = _snapshot(parent)
    with pytest.raises(UnsafePathError) as e:
        _extract(dest, name)
    assert "refusing to extract" in str(e.value)
    with pytest.raises(UnsafePathError):
        check_name(name)
    with pytest.raises(UnsafePathError):
        open_beneath(dest, name)
    assert _snapshot(parent) == before


@pytest.mark.parametrize(
    "name, reason",
    [
        ("../x", "'..' component"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty component"),
        ("./x", "'.' component"),
        ("x\0y", "NUL"),
        ("x" * 256, "NAME_MAX"),
        ("", "empty"),
    ],
)
def test_refusals_say_why(name, reason):
    with pytest.raises(UnsafePathError, match=reason):
        check_name(name)


@pytest.mark.parametrize("name", ["out/secret", "out/new", "out", "in/x", "secretlink", "out/dest/file"])
def test_symlinks_in_the_destination_are_never_followed(box, name):
    parent, dest = box
    before = _snapshot(parent)
    with pytest.raises(UnsafePathError, match="symlink"):
        _extract(dest, name)
    with pytest.raises(UnsafePathError, match="symlink"):
        open_beneath(dest, name)
    assert _snapshot(parent) == before
    assert (parent / "secret").read_text() == "keep me"


def test_going_through_a_file_is_refused(box):
    _, dest = box
    with pytest.raises(UnsafePathError, match="not a directory"):
        safe_path(dest, "file/x")


@pytest.mark.parametrize(
    "name",
    ["a", "a/b/c.txt", "..a", "a..", "...", ".hidden", "a/.b", "sp ace", "ünïcode/名前", "x" * NAME_MAX,
     "a\\b", b"bytes/name"],
)
def test_ordinary_names_land_inside(box, name):
    parent, dest = box
    target = _extract(dest, name)
    assert os.path.commonpath([os.path.realpath(dest), target]) == os.path.realpath(dest)
    assert target != os.path.realpath(dest)
    with open(target, "rb") as f:
        assert f.read() == b"pwned"
    assert (parent / "secret").read_text() == "keep me"
    assert sorted(os.listdir(parent)) == ["dest", "secret"]


def test_open_beneath_creates_parents_and_refuses_existing(box):
    _, dest = box
    fd = open_beneath(dest, "new/dir/file")
    os.write(fd, b"hi")
    os.close(fd)
    assert (dest / "new" / "dir" / "file").read_bytes() == b"hi"
    with pytest.raises(FileExistsError):
        open_beneath(dest, "new/dir/file")
    with pytest.raises(FileNotFoundError):
        open_beneath(dest, "missing/file", make_parents=False)


def test_a_symlink_swapped_in_after_the_check_is_not_followed(box):
    """safe_path checks the tree as it is; open_beneath holds on while it walks."""
    parent, dest = box
    (dest / "later").mkdir()
    safe_path(dest, "later/x")  # fine now
    (dest / "later").rmdir()
    os.symlink(parent, dest / "later")
    with pytest.raises(UnsafePathError, match="symlink"):
        open_beneath(dest, "later/x")
    assert not (parent / "x").exists()


def test_destination_must_be_a_directory(tmp_path):
    with pytest.raises(UnsafePathError, match="destination"):
        safe_path(tmp_path / "missing", "a")
    (tmp_path / "f").write_text("")
    with pytest.raises(UnsafePathError, match="not a directory"):
        safe_path(tmp_path / "f", "a")


def test_long_host_path_is_refused(tmp_path):
    deep = tmp_path
    for _ in range((PATH_MAX - len(str(tmp_path))) // 201):
        deep = deep / ("d" * 200)
    os.makedirs(deep, exist_ok=True)
    with pytest.raises(UnsafePathError, match="PATH_MAX"):
        safe_path(deep, "e" * 200)
