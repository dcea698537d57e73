"""The partitioner against the Java client: the same hash and partition for every key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.partitioner import key_partition, murmur2, partition_of, to_positive

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (apache/kafka, clients/src/test/java).
KAFKA_TEST_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# Printed by the Java client itself (kafka-clients 3.9.2 and 4.1.1 agree): for each key,
# Utils.murmur2(key.getBytes(UTF_8)) and Utils.toPositive(hash) % n for n in PARTITION_COUNTS.
PARTITION_COUNTS = (1, 3, 7, 12, 100)
JAVA_CLIENT_VECTORS: list[tuple[str, int, tuple[int, ...]]] = [
    ("", 275646681, (0, 0, 2, 9, 81)),
    ("a", -1563381124, (0, 1, 5, 4, 24)),
    ("ab", 316155434, (0, 2, 0, 2, 34)),
    ("abc", 479470107, (0, 0, 4, 3, 7)),
    ("abcd", -1323649548, (0, 2, 5, 8, 0)),
    ("abcde", 461995741, (0, 1, 4, 1, 41)),
    ("21", -973932308, (0, 0, 3, 0, 40)),
    ("foobar", -790332482, (0, 0, 0, 6, 66)),
    ("a-little-bit-long-string", -985981536, (0, 2, 1, 8, 12)),
    ("a-little-bit-longer-string", -1486304829, (0, 2, 0, 11, 19)),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, (0, 2, 3, 5, 77)),
    ("order-1", 1221710326, (0, 1, 4, 10, 26)),
    ("order-42", 501153024, (0, 0, 1, 0, 24)),
    ("bestellung-\u00f6", 174714052, (0, 1, 2, 4, 52)),
    ("\u00fcber", -1718265917, (0, 0, 5, 3, 31)),
    ("\u65e5\u672c\u8a9e", 1431860170, (0, 1, 6, 10, 70)),
    ("emoji-\U0001f680", -2137502778, (0, 2, 4, 2, 70)),
    ("\U0001f389\U0001f389", 51151104, (0, 0, 4, 0, 4)),
    ("tick~0~7", 979359985, (0, 1, 2, 1, 85)),
    ("\u0000\u00ff", -1951946001, (0, 2, 4, 11, 47)),
    ("\u007f\u0080", 10196938, (0, 1, 3, 10, 38)),
]

# Raw bytes (not UTF-8) of length 0 to 11, byte i = (0x80 + 17 * i) & 0xFF, from Java.
JAVA_CLIENT_BYTES = [
    275646681,
    857690492,
    627719599,
    309046872,
    -838711625,
    -2136307287,
    847163050,
    1556198382,
    -1041061038,
    -103652852,
    -336630971,
    -247874869,
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_TEST_VECTORS)
def test_murmur2_matches_kafkas_own_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("key", "expected", "partitions"), JAVA_CLIENT_VECTORS)
def test_hash_and_partition_match_the_java_client(
    key: str, expected: int, partitions: tuple[int, ...]
) -> None:
    assert murmur2(key.encode("utf-8")) == expected
    assert tuple(partition_of(key, n) for n in PARTITION_COUNTS) == partitions


@pytest.mark.parametrize(("length", "expected"), list(enumerate(JAVA_CLIENT_BYTES)))
def test_murmur2_of_raw_bytes_matches_the_java_client(length: int, expected: int) -> None:
    assert murmur2(bytes((0x80 + 17 * i) & 0xFF for i in range(length))) == expected


def test_to_positive_masks_the_sign_bit_as_java_does() -> None:
    assert to_positive(-(2**31)) == 0  # not abs(): Integer.MIN_VALUE has no positive twin
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(-973932308) == 1173551340
    assert to_positive(0) == 0
    assert to_positive(2**31 - 1) == 2**31 - 1


@pytest.mark.parametrize("partitions", [0, -1])
def test_partition_of_needs_a_partition(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions must be at least 1"):
        partition_of("order-1", partitions)


def test_partition_of_refuses_an_id_that_is_not_unicode() -> None:
    # Java would encode the lone surrogate as "?" and so hash another id
    with pytest.raises(UnicodeEncodeError):
        partition_of("x\ud800y", 3)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31


@settings(max_examples=300)
@given(st.text(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_of_is_in_range_and_deterministic(aggregate_id: str, partitions: int) -> None:
    partition = partition_of(aggregate_id, partitions)  # st.text() has no lone surrogates
    assert 0 <= partition < partitions
    assert partition_of(aggregate_id, partitions) == partition
    assert partition == to_positive(murmur2(aggregate_id.encode("utf-8"))) % partitions


@settings(max_examples=300)
@given(st.text(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_key_partition_is_partition_of_the_encoded_id(aggregate_id: str, partitions: int) -> None:
    key = aggregate_id.encode("utf-8")
    assert key_partition(key, partitions) == partition_of(aggregate_id, partitions)
    assert key_partition(key, partitions) == partition_of(aggregate_id, partitions)  # cached


@pytest.mark.parametrize("partitions", [0, -1])
def test_key_partition_needs_a_partition(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions must be at least 1"):
        key_partition(b"order-1", partitions)
