import pytest

from diag.units import GiB, MiB, SizeError, format_bytes, format_duration, parse_rate, parse_size


@pytest.mark.parametrize("text, expected", [
    ("47GiB", 47 * GiB), ("47.2GiB", round(47.2 * GiB)), ("512MiB", 512 * MiB), ("50GB", 50 * 10**9),
    ("1073741824", GiB), ("4 KiB", 4096), ("2tib", 2 << 40), ("100B", 100),
])
def test_parse_size_accepts_what_people_type(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["47XB", "-1GiB", "0", "0GiB", "", "GiB", "1.5", "47 GiB GiB", "1e9", "abc"])
def test_parse_size_rejects_with_the_value_and_an_example(text):
    with pytest.raises(SizeError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message and "47GiB" in message


def test_parse_rate():
    assert parse_rate("11MB/s") == 11_000_000
    assert parse_rate("16MiB/s") == 16 * MiB
    assert parse_rate("2800pages/s") == 2800 * 4096
    for bad in ("11MB", "fast", "0pages/s", "-3MB/s"):
        with pytest.raises(SizeError):
            parse_rate(bad)


def test_format():
    assert format_bytes(47.2 * GiB) == "47.2 GiB"
    assert format_bytes(188 * MiB) == "188 MiB"
    assert format_bytes(0) == "0 B"
    assert format_bytes(-3 * MiB) == "-3 MiB"
    assert format_bytes(2 * MiB, signed=True) == "+2 MiB"
    assert format_duration(1500) == "25 min"
    assert format_duration(25.3) == "25.3 s"
    assert format_duration(150) == "2.5 min"
