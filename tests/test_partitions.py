"""Partition names, folders and ranges (picasso.connectors.partitions)."""

import pytest

from picasso.connectors.day_files import list_day_files, partition_dir
from picasso.connectors.partitions import next_partition, partition_path, partition_range, with_hours


def test_a_range_of_days_includes_both_ends_across_a_month():
    assert partition_range("2026-10-30..2026-11-02") == ["2026-10-30", "2026-10-31", "2026-11-01", "2026-11-02"]
    assert partition_range("2026-11-05") == ["2026-11-05"]


def test_a_range_of_hours_crosses_midnight_in_order():
    hours = partition_range("2026-11-01T22..2026-11-02T01")
    assert hours == ["2026-11-01T22", "2026-11-01T23", "2026-11-02T00", "2026-11-02T01"]
    assert hours == sorted(hours)


def test_hours_split_each_date():
    assert with_hours(["2026-11-01", "2026-11-02"], "22..23") == [
        "2026-11-01T22", "2026-11-01T23", "2026-11-02T22", "2026-11-02T23"]
    assert with_hours(["2026-11-01"], "5") == ["2026-11-01T05"]


def test_folders_of_dates_and_hours(tmp_path):
    assert partition_path("2026-11-01") == "date=2026-11-01"
    assert partition_path("2026-11-01T05") == "date=2026-11-01/hour=05"
    assert partition_dir(tmp_path, "2026-11-01T05") == str(tmp_path / "date=2026-11-01" / "hour=05")


@pytest.mark.parametrize("text, message", [
    ("2026-13-01", "month must be in 1..12"),
    ("2026/11/01", "expected YYYY-MM-DD or YYYY-MM-DDTHH"),
    ("2026-11-01T24", "hour 24 is not 00-23"),
    ("2026-11-03..2026-11-01", "ends before it starts"),
    ("2026-11-01..2026-11-02T05", "both ends are dates, or both are dates with an hour"),
    ("2000-01-01T00..2099-01-01T00", "more than 100000"),
])
def test_bad_ranges_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        partition_range(text)


@pytest.mark.parametrize("hours, message", [("0..24", "0 <= first <= last <= 23"), ("5..2", "0 <= first"),
                                            ("morning", "expected H or H..H")])
def test_bad_hours_say_what_is_wrong(hours, message):
    with pytest.raises(ValueError, match=message):
        with_hours(["2026-11-01"], hours)


def test_hours_cannot_split_an_hour():
    with pytest.raises(ValueError, match="already has an hour"):
        with_hours(["2026-11-01T05"], "0..23")


def test_a_date_of_hourly_folders_names_them(tmp_path):
    (tmp_path / "date=2026-11-01" / "hour=00").mkdir(parents=True)
    (tmp_path / "date=2026-11-01" / "hour=23").mkdir()
    with pytest.raises(FileNotFoundError, match=r"hourly partitions \(hour=00 .. hour=23\).*--hours 0..23"):
        list_day_files(tmp_path, "2026-11-01")


def test_the_next_partition_is_the_next_day_or_hour():
    assert next_partition("2026-11-30") == "2026-12-01"
    assert next_partition("2026-11-01T05") == "2026-11-01T06"
    assert next_partition("2026-12-31T23") == "2027-01-01T00"
