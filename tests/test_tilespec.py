"""Tile specifications: parsing, errors, and the formatting that reports use."""

from __future__ import annotations

import numpy as np
import pytest

from ipuos import TileSpecError, format_tiles, parse_tiles
from ipuos._tilespec import tile_of_name


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("0-3,7", [0, 1, 2, 3, 7]),
        (" 5 ", [5]),
        ("0-10:5", [0, 5, 10]),
        ("3,1,2,1", [1, 2, 3]),
        ("all", list(range(16))),
        (None, list(range(16))),
        ([4, 2], [2, 4]),
        (9, [9]),
        (np.int64(9), [9]),  # any integer, as for an index: numpy's ...
        (np.arange(3, 6), [3, 4, 5]),
        ([np.int32(4), 2], [2, 4]),
    ],
)
def test_parse(spec, expected):
    assert parse_tiles(spec, 16) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty tile specification"),
        ("0-16", "no tile 16 on this machine"),
        ("5-2", "runs backwards"),
        ("x", "'x' is not a tile id"),
        ("\u00b2", "is not a tile id"),  # a digit to str.isdigit, not to int()
        ("1-\u0663", "is not a tile id"),
        ("1,,2", "'' is not a tile id"),
        ("0-8:0", "step"),
        ([1, 99], "no tile 99"),
        (["1"], "must be integers"),
        ("9" * 5000, "far too many digits"),  # past int()'s own limit: still a spec error
        ("0-" + "9" * 19, "far too many digits"),
        ("0-8:" + "9" * 5000, "far too many digits"),
        ("0" * 4301, "far too many digits"),  # int() counts leading zeros against its limit
        ("0-3:" + "0" * 4301, "far too many digits"),
        (range(10**20), "no tile 99999999999999999999"),  # checked by its ends, never listed
        (True, "not True"),  # a slip, not tile 1
        ([False], "must be integers"),
        (np.array([1.5]), "must be integers"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(TileSpecError, match=message):
        parse_tiles(spec, 16)


@pytest.mark.parametrize(
    "tiles, text",
    [
        ([0, 1, 2, 5], "0-2,5"),
        (list(range(0, 1472, 3)), "0-1470:3"),
        ([1, 3], "1,3"),
        ([7], "7"),
    ],
)
def test_format_round_trips(tiles, text):
    assert format_tiles(tiles) == text
    assert parse_tiles(text, 1472) == tiles


@pytest.mark.parametrize("name, tile", [("0", 0), ("7", 7), ("1471", 1471), ("07", None), ("00", None),
                                        ("+7", None), (" 7", None), ("7 ", None), ("", None),
                                        ("\u0667", None), ("\u00b2", None), ("1" * 19, None)])
def test_a_tile_name_is_its_number_in_canonical_decimal(name, tile):
    # /tiles/N, the image device N: one tile, one name (a spec's numbers may have zeros)
    assert tile_of_name(name) == tile
